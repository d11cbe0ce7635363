"""OpenAI response bodies built from the engine's events.

:class:`Transcript` accumulates one request's events (tokens, which model wrote each, the finishing
trace) and turns tokens into text incrementally for streaming, ending the text before the first
``stop`` string (found in the decoded text, so a stop string split across tokens is found too; text
that may begin a stop string is held back from the stream until it cannot); the ``*_body`` / ``*_chunk``
functions shape the OpenAI JSON. ``usage`` carries the usual counts plus ``llm_tokens``,
``slm_tokens`` and ``switches`` (read from the finishing event's :class:`StitchTrace`).
"""

from __future__ import annotations

import time
from typing import Any

from ..core.roles import Role

CONTEXT = 8  # tokens decoded again before the unsettled ones (Transcript._decoded)


class Transcript:
    """One request's output so far. ``add(event)`` returns the new text to stream (possibly ""); once a stop
    string appears, ``stopped`` is set, the text ends before it and ``finish_reason`` is ``stop``."""

    def __init__(self, tokenizer: Any, prompt_tokens: int, stop: tuple[str, ...] = (), notes: list[str] = ()):
        self.tokenizer = tokenizer
        self.notes = list(notes)  # what the answer says about the request once (e.g. messages the template left out)
        self.prompt_tokens = prompt_tokens
        self.stop = tuple(s for s in stop if s)
        self.tokens: list[int] = []
        self.roles: list[Role] = []
        self.sent = ""  # text streamed so far
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.error_code: str | None = None  # the engine's Event.error_code (KV_FULL: answered 503)
        self.trace = None
        self.stopped = False
        self._cut: int | None = None  # where the text ends (a stop string begins there)
        self._settled, self._settled_text = 0, ""  # tokens whose text no later token changes, and that text

    def add_all(self, events: list) -> str:
        """:meth:`add` for several events of one request, in order: the new text they make, decoded once when no
        stop string can end the text early (with stop strings, event by event: the first stop string found wins,
        as it does streaming one event at a time)."""
        if self.stop or len(events) == 1:
            return "".join(self.add(ev) for ev in events)
        if self.stopped:
            return ""
        for ev in events[:-1]:
            self._append(ev)
        return self.add(events[-1])

    def add(self, event: Any) -> str:
        if self.stopped:
            return ""
        self._append(event)
        text = self._decoded()  # one decode per event: the stop search and the delta read the same text
        if self.stop and self._find_stop(text):
            self.finish_reason, self.trace = "stop", getattr(event, "trace", None)
            return self._delta(text[:self._cut], final=True)
        if event.finished:
            self.finish_reason, self.error, self.trace = event.finish_reason, event.error, event.trace
            self.error_code = getattr(event, "error_code", None)
            return self._delta(text, final=True)
        return self._delta(text, final=False) if event.token is not None else ""

    def _append(self, event: Any) -> None:
        if event.token is not None:
            self.tokens.append(int(event.token))
            self.roles.append(event.role)

    def _find_stop(self, text: str) -> bool:
        start = max(0, len(self.sent) - max(map(len, self.stop)))  # a stop string may end in new text only
        hits = [i for i in (text.find(s, start) for s in self.stop) if i >= 0]
        if not hits:
            return False
        self._cut, self.stopped = min(hits), True
        return True

    def _delta(self, text: str, final: bool) -> str:
        if not final:  # hold back an incomplete multi-byte character, and text that may begin a stop string
            if text.endswith("\ufffd"):
                return ""
            text = text[:len(text) - self._stop_prefix(text)]
        if not text.startswith(self.sent):  # a later token rewrote streamed text
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta

    def _stop_prefix(self, text: str) -> int:
        """Length of the longest end of ``text`` that begins some stop string."""
        return max((n for s in self.stop for n in range(min(len(s) - 1, len(text)), 0, -1)
                    if text.endswith(s[:n])), default=0)

    def _decoded(self) -> str:
        """The text of every token so far, decoding only the tokens after the settled prefix (with ``CONTEXT``
        tokens before them, whose text is cut off again: a token's text may depend on the one before, e.g. a
        leading space): a long answer costs the same per write as a short one. Where the context's text is not a
        prefix of the window's, the whole answer is decoded."""
        start = max(0, self._settled - CONTEXT)
        head = self._decode(self.tokens[start:self._settled])
        window = self._decode(self.tokens[start:])
        if not window.startswith(head):
            return self._decode(self.tokens)
        if len(self.tokens) - self._settled >= 4 * CONTEXT:  # settle all but the last CONTEXT tokens
            cut = len(self.tokens) - CONTEXT
            part = self._decode(self.tokens[start:cut])
            if part.startswith(head) and not part.endswith("\ufffd") and window.startswith(part):
                self._settled_text += part[len(head):]
                self._settled = cut
                head = part
        return self._settled_text + window[len(head):]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @property
    def text(self) -> str:
        text = self._decoded()
        return text if self._cut is None else text[:self._cut]

    def usage(self) -> dict[str, int]:
        """OpenAI usage plus the stitch counts (from the trace; from the event roles without one)."""
        n = len(self.tokens)
        if self.trace is not None:
            llm, slm, switches = self.trace.llm_tokens, self.trace.slm_tokens, self.trace.switches
        else:
            llm = sum(r is Role.LLM for r in self.roles)
            slm = sum(r is Role.SLM for r in self.roles)
            switches = sum(a is not b for a, b in zip(self.roles, self.roles[1:]))
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": n, "total_tokens": self.prompt_tokens + n,
                "llm_tokens": llm, "slm_tokens": slm, "switches": switches}


def _head(request_id: str, obj: str, model: str, created: int | None) -> dict[str, Any]:
    return {"id": request_id, "object": obj, "created": created or int(time.time()), "model": model}


def chat_body(request_id: str, model: str, tr: Transcript) -> dict[str, Any]:
    choice = {"index": 0, "message": {"role": "assistant", "content": tr.text}, "logprobs": None,
              "finish_reason": tr.finish_reason}
    return {**_head(request_id, "chat.completion", model, None), "choices": [choice], "usage": tr.usage(),
            **_notes(tr.notes)}


def _notes(notes: list[str]) -> dict[str, Any]:
    """The ``notes`` field, present only when there is something to say."""
    return {"notes": notes} if notes else {}


def completion_body(request_id: str, model: str, tr: Transcript) -> dict[str, Any]:
    choice = {"index": 0, "text": tr.text, "logprobs": None, "finish_reason": tr.finish_reason}
    return {**_head(request_id, "text_completion", model, None), "choices": [choice], "usage": tr.usage()}


def chat_chunk(request_id: str, model: str, created: int, delta: dict[str, Any], finish_reason: str | None = None,
               usage: dict[str, int] | None = None, notes: list[str] = ()) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    return {**_head(request_id, "chat.completion.chunk", model, created), "choices": [choice], "usage": usage,
            **_notes(list(notes))}


def completion_chunk(request_id: str, model: str, created: int, text: str, finish_reason: str | None = None,
                     usage: dict[str, int] | None = None) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return {**_head(request_id, "text_completion", model, created), "choices": [choice], "usage": usage}


def usage_chunk(request_id: str, obj: str, model: str, created: int, usage: dict[str, int]) -> dict[str, Any]:
    """The extra last chunk of ``stream_options.include_usage``: no choices, the usage."""
    return {**_head(request_id, obj, model, created), "choices": [], "usage": usage}
