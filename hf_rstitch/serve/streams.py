"""From a request's engine events to its HTTP answer: one JSON body, or server-sent events.

:func:`follow` yields one request's events and cancels its row when the client leaves or the answer
ends early (a ``stop`` string); :func:`whole_response`, :func:`stream_chat` and :func:`stream_text`
shape them. Every stream ends with ``data: [DONE]``: after the last chunk, or after an error event
(``{"error": ...}``) when decoding failed, the server shut down first, or the responder itself
failed -- never a cut connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse

from ..serving.request_types import KV_FULL
from .driver import EngineDriver
from .errors import error, error_body
from .responses import Transcript, chat_body, chat_chunk, completion_body, completion_chunk, usage_chunk

log = logging.getLogger("hf_rstitch.serve")


async def follow(driver: EngineDriver, rid: str, queue: asyncio.Queue, request: Request,
                 poll_s: float) -> AsyncIterator[Any]:
    """This request's events until the finishing one; cancels the row if the client leaves first
    (noticed by polling) or the reader stops early (``aclose``)."""
    loop = asyncio.get_running_loop()
    finished, next_check = False, loop.time() + poll_s
    try:
        while True:
            if loop.time() >= next_check:  # every poll_s, also while events keep coming
                if await request.is_disconnected():
                    return
                next_check = loop.time() + poll_s
            try:
                event = await asyncio.wait_for(queue.get(), max(1e-3, next_check - loop.time()))
            except asyncio.TimeoutError:
                continue
            finished = event.finished
            yield event
            if finished:
                return
    finally:
        if not finished:
            driver.cancel(rid)


async def _read(tr: Transcript, events) -> AsyncIterator[tuple[Any, str]]:
    """``(event, new text)`` until the request ends or a stop string ends it (then its row is cancelled)."""
    try:
        async for ev in events:
            delta = tr.add(ev)
            yield ev, delta
            if tr.stopped:
                return
    finally:
        await events.aclose()


async def whole_response(rid: str, kind: str, model: str, tr: Transcript, events) -> JSONResponse:
    """The non-streaming answer once the request has finished (or an error saying why it did not)."""
    async for _ in _read(tr, events):
        pass
    if tr.finish_reason is None:  # the client left; nobody reads this
        return error(499, "client disconnected", kind="cancelled")
    if tr.finish_reason == "error" and tr.error_code == KV_FULL:  # the KV memory could not hold it: retry later
        return error(503, tr.error or "out of KV memory", kind="server_overloaded", code=KV_FULL,
                     headers={"Retry-After": "5"})
    if tr.finish_reason == "error":
        return error(500, tr.error or "decoding failed", kind="server_error")
    if tr.finish_reason == "cancelled":
        return error(503, tr.error or "the server shut down before this request finished; retry")
    build = chat_body if kind == "chat" else completion_body
    return JSONResponse(build(rid, model, tr))


def _sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def _ended_badly(tr: Transcript) -> str:
    kind = "server_error" if tr.finish_reason == "error" else "server_shutting_down"
    if tr.error_code == KV_FULL:
        kind = "server_overloaded"
    return _sse(error_body(tr.error or "the server stopped this request", kind, code=tr.error_code))


async def stream_chat(rid: str, model: str, usage_chunk_too: bool, tr: Transcript, events) -> AsyncIterator[str]:
    created = int(time.time())
    try:
        yield _sse(chat_chunk(rid, model, created, {"role": "assistant", "content": ""}))
        async for ev, delta in _read(tr, events):
            if tr.finish_reason in ("error", "cancelled"):
                yield _ended_badly(tr)
                break
            if delta:
                yield _sse(chat_chunk(rid, model, created, {"content": delta}))
            if tr.finish_reason is not None:
                yield _sse(chat_chunk(rid, model, created, {}, tr.finish_reason, tr.usage()))
                if usage_chunk_too:
                    yield _sse(usage_chunk(rid, "chat.completion.chunk", model, created, tr.usage()))
        if tr.finish_reason is None:
            return  # the client left
    except Exception as err:  # noqa: BLE001 -- the stream has begun: the error goes in it
        log.exception("streaming %s failed", rid)
        yield _sse(error_body(f"the server failed while streaming ({type(err).__name__}: {err})", "server_error"))
    yield _sse("[DONE]")


async def stream_text(rid: str, model: str, usage_chunk_too: bool, tr: Transcript, events) -> AsyncIterator[str]:
    created = int(time.time())
    try:
        async for ev, delta in _read(tr, events):
            if tr.finish_reason in ("error", "cancelled"):
                yield _ended_badly(tr)
                break
            if tr.finish_reason is not None:
                yield _sse(completion_chunk(rid, model, created, delta, tr.finish_reason, tr.usage()))
                if usage_chunk_too:
                    yield _sse(usage_chunk(rid, "text_completion", model, created, tr.usage()))
            elif delta:
                yield _sse(completion_chunk(rid, model, created, delta))
        if tr.finish_reason is None:
            return
    except Exception as err:  # noqa: BLE001
        log.exception("streaming %s failed", rid)
        yield _sse(error_body(f"the server failed while streaming ({type(err).__name__}: {err})", "server_error"))
    yield _sse("[DONE]")
