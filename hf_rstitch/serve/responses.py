"""OpenAI response bodies built from the engine's events.

:class:`Transcript` accumulates one request's events (tokens, which model wrote each, the finishing
trace) and turns tokens into text incrementally for streaming; the ``*_body`` / ``*_chunk``
functions shape the OpenAI JSON. ``usage`` carries the usual counts plus ``llm_tokens``,
``slm_tokens`` and ``switches`` (read from the finishing event's :class:`StitchTrace`).
"""

from __future__ import annotations

import time
from typing import Any

from ..core.roles import Role


class Transcript:
    """One request's output so far. ``add(event)`` returns the new text to stream (possibly "")."""

    def __init__(self, tokenizer: Any, prompt_tokens: int):
        self.tokenizer = tokenizer
        self.prompt_tokens = prompt_tokens
        self.tokens: list[int] = []
        self.roles: list[Role] = []
        self.sent = ""  # text streamed so far
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.trace = None

    def add(self, event: Any) -> str:
        if event.token is not None:
            self.tokens.append(int(event.token))
            self.roles.append(event.role)
        if event.finished:
            self.finish_reason, self.error, self.trace = event.finish_reason, event.error, event.trace
            return self._delta(final=True)
        return self._delta(final=False) if event.token is not None else ""

    def _delta(self, final: bool) -> str:
        text = self.text
        # hold back an incomplete multi-byte character, and text a later token rewrites
        if not text.startswith(self.sent) or (not final and text.endswith("\ufffd")):
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta

    @property
    def text(self) -> str:
        return self.tokenizer.decode(self.tokens, skip_special_tokens=True)

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
    return {**_head(request_id, "chat.completion", model, None), "choices": [choice], "usage": tr.usage()}


def completion_body(request_id: str, model: str, tr: Transcript) -> dict[str, Any]:
    choice = {"index": 0, "text": tr.text, "logprobs": None, "finish_reason": tr.finish_reason}
    return {**_head(request_id, "text_completion", model, None), "choices": [choice], "usage": tr.usage()}


def chat_chunk(request_id: str, model: str, created: int, delta: dict[str, Any], finish_reason: str | None = None,
               usage: dict[str, int] | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    return {**_head(request_id, "chat.completion.chunk", model, created), "choices": [choice], "usage": usage}


def completion_chunk(request_id: str, model: str, created: int, text: str, finish_reason: str | None = None,
                     usage: dict[str, int] | None = None) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return {**_head(request_id, "text_completion", model, created), "choices": [choice], "usage": usage}


def usage_chunk(request_id: str, obj: str, model: str, created: int, usage: dict[str, int]) -> dict[str, Any]:
    """The extra last chunk of ``stream_options.include_usage``: no choices, the usage."""
    return {**_head(request_id, obj, model, created), "choices": [], "usage": usage}


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
