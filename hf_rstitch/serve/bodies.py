"""Request bodies read into their OpenAI models off the event loop, at a cost bounded by the body's size.

FastAPI validates a declared body on the event loop; a 4 MB body of two million token ids, or of 120k empty chat
messages, then holds the loop (and every stream it serves) for a second or more. Here the handlers take the raw
bytes (:class:`~.errors.BodyLimit` bounds them) and :class:`BodyReader` reads them elsewhere: a small body (the
usual request) on a worker thread, a large one in a separate process, because ``json.loads`` of megabytes is one C
call that holds the GIL for a third of a second whichever thread makes it. :func:`parse` is the whole reading, the
same wherever it runs: the content type, UTF-8, JSON (an integer past Python's 4300 digits becomes a
:class:`~.protocol.HugeInt` that the field holding it names), then the count bounds the context sets (more token
ids or messages than the model reads are refused before pydantic walks them), then the model's validation. Every
refusal is a :class:`~.errors.BadRequest` naming the field; nothing here knows the engine, the tokenizer or HTTP.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from pydantic import BaseModel, ValidationError

from .errors import BadRequest, validation_message
from .protocol import ChatCompletionRequest, CompletionRequest, HugeInt

log = logging.getLogger("hf_rstitch.serve")
SMALL_BODY = 64 * 1024  # bytes read on a worker thread (json.loads holds the GIL ~1 ms); larger: another process
_MAX_ARG_STRLEN = 128 * 1024  # bytes of one environment string exec passes (Linux)
_START = threading.Lock()
MODELS: dict[str, type[BaseModel]] = {"chat": ChatCompletionRequest, "text": CompletionRequest}


def parse(raw: bytes, content_type: str | None, kind: str, max_context: int | None) -> BaseModel:
    """The body of a ``kind`` request (``chat`` / ``text``) as its model; raises :class:`BadRequest`."""
    data = read_json(raw, content_type)
    if max_context is not None and isinstance(data, dict):
        _check_counts(data, kind, max_context)
    try:
        return MODELS[kind].model_validate(data)
    except ValidationError as err:
        param, message = validation_message(err)
        raise BadRequest(message, param=param) from None


def read_json(raw: bytes, content_type: str | None) -> Any:
    """The JSON value of ``raw``: UTF-8, a JSON content type (or none), integers of any length."""
    if content_type and not _is_json(content_type):
        raise BadRequest(f"invalid request body: Content-Type {content_type.split(';')[0].strip()!r} is not JSON; "
                         "send the body as JSON with the header Content-Type: application/json")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadRequest(f"the body is not UTF-8 ({err.reason} at byte {err.start}): send a JSON object in "
                         "UTF-8") from None
    if not text.strip():
        raise BadRequest("invalid request body: the body is empty; send a JSON object")
    try:
        return json.loads(text)
    except RecursionError:
        raise BadRequest("the body is nested too deeply to read: send a JSON object nested at most a few hundred "
                         "levels") from None
    except json.JSONDecodeError as err:
        raise BadRequest(f"invalid request body: the body is not valid JSON ({err.msg}: line {err.lineno} column "
                         f"{err.colno})") from None
    except ValueError:  # an integer with more digits than Python reads: the field that holds it says so
        return json.loads(text, parse_int=_int_or_huge)


def _int_or_huge(digits: str) -> int | HugeInt:
    try:
        return int(digits)
    except ValueError:
        return HugeInt(digits)


def _is_json(content_type: str) -> bool:
    kind = content_type.split(";")[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def _check_counts(data: dict, kind: str, max_context: int) -> None:
    """Refuse, before validation walks them, more token ids or chat messages than the model reads tokens (every
    message the chat template keeps costs at least one token)."""
    if kind == "text":
        prompt = data.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
            prompt = prompt[0]
        if isinstance(prompt, list) and len(prompt) > max_context:
            raise BadRequest(f"the prompt has {len(prompt)} token ids but the model reads at most {max_context} "
                             "(its max_position_embeddings); shorten the prompt", param="prompt")
    messages = data.get("messages") if kind == "chat" else None
    if isinstance(messages, list) and len(messages) > max_context:
        raise BadRequest(f"{len(messages)} messages: each costs at least one token and the model reads at most "
                         f"{max_context} (its max_position_embeddings); send fewer messages", param="messages")


class BodyReader:
    """:func:`parse` off the event loop: on a worker thread up to ``small`` bytes, else in a reader process (one,
    started on the first large body and again if it dies)."""

    def __init__(self, max_context: int | None, small: int = SMALL_BODY):
        self.max_context, self.small = max_context, small
        self._pool: ProcessPoolExecutor | None = None

    async def __call__(self, raw: bytes, content_type: str | None, kind: str) -> BaseModel:
        args = (raw, content_type, kind, self.max_context)
        if len(raw) <= self.small:
            return await asyncio.to_thread(parse, *args)
        loop = asyncio.get_running_loop()
        try:
            pool = self._pool or await asyncio.to_thread(self._start)
            return await loop.run_in_executor(pool, parse, *args)
        except BrokenProcessPool:  # the reader process died (killed, out of memory): a fresh one for the next body
            log.warning("the body reader process died; starting another")
            self._pool = None
            raise BadRequest("the server could not read this body (its reader process stopped); retry") from None

    def _start(self) -> ProcessPoolExecutor:
        """The reader process, started (on a worker thread: it takes a second) without the environment variables
        no exec passes (Linux refuses a string over 128 KiB; pytest's PYTEST_CURRENT_TEST can be one)."""
        import multiprocessing
        import os

        with _START:
            if self._pool is None:
                unpassable = {k: v for k, v in os.environ.items() if len(k) + len(v) + 2 > _MAX_ARG_STRLEN}
                for name in unpassable:
                    del os.environ[name]
                try:
                    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
                    pool.submit(int).result()  # the process starts here
                finally:
                    os.environ.update(unpassable)
                self._pool = pool
            return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
