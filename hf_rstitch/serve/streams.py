"""From a request's engine events to its HTTP answer: one JSON body, or server-sent events.

:func:`follow` yields one request's events, in lists of those that arrived together (:mod:`.handover`), and
cancels its row when the client leaves or the answer ends early (a ``stop`` string); :func:`whole_response`,
:func:`stream_chat` and :func:`stream_text` shape them, one write per list: a paced stream, or one that falls
behind the engine, sends several tokens' text in one chunk (OpenAI clients join deltas of any length). Every
stream ends with ``data: [DONE]``: after the last chunk, or after an error event (``{"error": ...}``) when
decoding failed, the server shut down first, or the responder itself failed -- never a cut connection.
"""

from __future__ import annotations

import asyncio
import json
import math
import logging
import time
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse

from ..batching.request_types import KV_FULL
from .driver import EngineDriver
from .errors import error, error_body
from .handover import Mailbox, Pacer
from .responses import Transcript, chat_body, chat_chunk, completion_body, completion_chunk, usage_chunk

log = logging.getLogger("hf_rstitch.serve")


async def follow(driver: EngineDriver, rid: str, box: Mailbox, request: Request, poll_s: float | None,
                 pacer: Pacer | None = None) -> AsyncIterator[list]:
    """This request's events until the finishing one, in lists: every event that arrived since the last list was
    taken -- several when the reader fell behind the engine, or when ``pacer`` spaces this answer's writes (the
    finishing event is taken at once). Cancels the row if the client leaves first (noticed by polling every
    ``poll_s``; None: no polling, for a stream, whose responder closes this iterator when its client leaves) or the
    reader stops early (``aclose``)."""
    loop = asyncio.get_running_loop()
    pacer = pacer or Pacer()
    finished, hold_until = False, 0.0
    next_check = math.inf if poll_s is None else loop.time() + poll_s
    pacer.open += 1
    try:
        while True:
            now = loop.time()
            if now >= next_check:  # every poll_s, also while events keep coming
                if await request.is_disconnected():
                    return
                next_check = loop.time() + poll_s
            if now < hold_until and not box.final:  # the last write went out just now: gather tokens meanwhile
                await box.wait(min(hold_until, next_check) - now, final_only=True)
                continue
            events = box.take()
            if not events:
                await box.wait(None if poll_s is None else next_check - now)
                continue
            finished = events[-1].finished
            yield events
            if finished:
                return
            hold_until = loop.time() + pacer.spacing()
    finally:
        pacer.open -= 1
        if not finished:
            driver.cancel(rid)


async def _read(tr: Transcript, batches) -> AsyncIterator[str]:
    """The new text of each list of events until the request ends or a stop string ends it (then its row is
    cancelled)."""
    try:
        async for events in batches:
            yield tr.add_all(events)
            if tr.stopped:
                return
    finally:
        await batches.aclose()


async def whole_response(rid: str, kind: str, model: str, tr: Transcript, batches) -> JSONResponse:
    """The non-streaming answer once the request has finished (or an error saying why it did not)."""
    async for _ in _read(tr, batches):
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


async def stream_chat(rid: str, model: str, usage_chunk_too: bool, tr: Transcript, batches) -> AsyncIterator[str]:
    """Chat chunks: the role first, then one chunk of new text per list of events (one write: the finishing
    chunk and the usage chunk go with the last text)."""
    created = int(time.time())
    try:
        yield _sse(chat_chunk(rid, model, created, {"role": "assistant", "content": ""}, notes=tr.notes))
        async for delta in _read(tr, batches):
            if tr.finish_reason in ("error", "cancelled"):
                yield _ended_badly(tr)
                break
            out = _sse(chat_chunk(rid, model, created, {"content": delta})) if delta else ""
            if tr.finish_reason is not None:
                out += _sse(chat_chunk(rid, model, created, {}, tr.finish_reason, tr.usage()))
                if usage_chunk_too:
                    out += _sse(usage_chunk(rid, "chat.completion.chunk", model, created, tr.usage()))
            if out:
                yield out
        if tr.finish_reason is None:
            return  # the client left
    except Exception as err:  # noqa: BLE001 -- the stream has begun: the error goes in it
        log.exception("streaming %s failed", rid)
        yield _sse(error_body(f"the server failed while streaming ({type(err).__name__}: {err})", "server_error"))
    yield _sse("[DONE]")


async def stream_text(rid: str, model: str, usage_chunk_too: bool, tr: Transcript, batches) -> AsyncIterator[str]:
    """Completion chunks: one of new text per list of events; the last one carries the finish reason and usage."""
    created = int(time.time())
    try:
        async for delta in _read(tr, batches):
            if tr.finish_reason in ("error", "cancelled"):
                yield _ended_badly(tr)
                break
            if tr.finish_reason is not None:
                out = _sse(completion_chunk(rid, model, created, delta, tr.finish_reason, tr.usage()))
                if usage_chunk_too:
                    out += _sse(usage_chunk(rid, "text_completion", model, created, tr.usage()))
                yield out
            elif delta:
                yield _sse(completion_chunk(rid, model, created, delta))
        if tr.finish_reason is None:
            return
    except Exception as err:  # noqa: BLE001
        log.exception("streaming %s failed", rid)
        yield _sse(error_body(f"the server failed while streaming ({type(err).__name__}: {err})", "server_error"))
    yield _sse("[DONE]")
