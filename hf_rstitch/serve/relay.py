"""The two halves of a replicated server that know nothing of Ray: a replica's app called in-process, and the
front app that relays requests to replicas and turns a lost replica into a clean OpenAI error.

A replica (:mod:`.replicas`) holds the app of ``rstitch serve`` and answers :func:`call_app`: one HTTP request
run through the app's ASGI interface in the replica's own process, yielding the response's head (status,
headers), then its body chunks as the app sends them (a stream's events one by one). The front app
(:func:`front_app`) receives the client's request, sends it to a replica through ``forward`` -- any callable
returning such an async iterator; Ray Serve's deployment handle through :func:`.replicas.forward_to` -- and
relays the answer.
When the replica fails instead (its process died, its GPU was lost), the client gets what the
server itself answers when it cannot serve: a 503 with OpenAI's error body before the answer has begun, or an
error event and ``data: [DONE]`` in a stream that has begun. Requests on other replicas are not touched. A request
that no replica may take (every one holds its rows and queue, ``forward`` raises :class:`AtCapacity`) gets what a
full server answers: a 429 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from .errors import error, error_body

log = logging.getLogger("hf_rstitch.serve")
Forward = Callable[[dict[str, Any], bytes], AsyncIterator[Any]]  # (request head, body) -> head, then body chunks
LOST = "the server replica handling this request stopped"  # how every lost-replica error begins


class AtCapacity(Exception):
    """Raised by ``forward`` when every replica holds as many requests as it may (nothing was started)."""


async def call_app(app, head: dict[str, Any], body: bytes) -> AsyncIterator[Any]:
    """Run one request through the ASGI ``app`` in this process: yields ``{"status", "headers"}``, then the body
    as the app sends it (bytes; chunks that queued while the last one was taken come joined). ``head``: ``method``, ``path``, ``query`` (str),
    ``headers`` (list of [name, value] strings). Stopping the iteration early tells the app the client left."""
    messages: asyncio.Queue = asyncio.Queue()
    left = asyncio.Event()
    delivered = False

    async def receive():
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await left.wait()
        return {"type": "http.disconnect"}

    task = asyncio.create_task(app(_scope(head), receive, messages.put))
    task.add_done_callback(lambda _: messages.put_nowait(None))
    try:
        while (msg := await messages.get()) is not None:
            if msg["type"] == "http.response.start":
                yield {"status": msg["status"], "headers": [(k.decode(), v.decode()) for k, v in msg["headers"]]}
            elif msg["type"] == "http.response.body":
                chunk, more = _joined(msg, messages)
                if chunk:
                    yield bytes(chunk)
                if not more:
                    break
    finally:
        left.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), 5)
        except Exception:  # noqa: BLE001 -- the app's own error was answered (a 500) or it is cancelled below
            task.cancel()


def _scope(head: dict[str, Any]) -> dict[str, Any]:
    """The ASGI scope of an HTTP request from a local client (``head`` as :func:`call_app` takes it)."""
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": head["method"],
            "scheme": "http", "path": head["path"], "raw_path": head["path"].encode(), "root_path": "",
            "query_string": head.get("query", "").encode(), "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0),
            "headers": [(k.lower().encode(), v.encode()) for k, v in head.get("headers", [])]}


def _joined(msg: dict, messages: asyncio.Queue) -> tuple[bytearray, bool]:
    """A body message's bytes joined with the body messages that queued behind it (events that queued while the
    last was relayed: one item), and whether more body follows (False at the app's end, the queue's None)."""
    chunk, more = bytearray(msg.get("body", b"")), msg.get("more_body", False)
    while more and not messages.empty():
        nxt = messages.get_nowait()
        if nxt is None:
            more = False
            break
        chunk += nxt.get("body", b"")
        more = nxt.get("more_body", False)
    return chunk, more


def lost(err: BaseException) -> str:
    first = (str(err).strip().splitlines() or [""])[0][:200]  # Ray's messages go on for lines
    return (f"{LOST} ({type(err).__name__}: {first}); "
            "retry: another replica, or this one restarted, will take it")


def front_app(forward: Forward, title: str = "hf-rstitch replicas"):
    """The ASGI app in front of the replicas: every path relayed to ``forward``; a replica lost before its answer
    began is a 503 OpenAI error, one lost mid-stream an error event and ``data: [DONE]``."""
    app = FastAPI(title=title, openapi_url=None, docs_url=None, redoc_url=None)

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"])
    async def relay(request: Request, path: str):
        head = {"method": request.method, "path": request.url.path, "query": request.url.query,
                "headers": [[k, v] for k, v in request.headers.items() if k not in ("host", "content-length")]}
        body = await request.body()
        try:
            answer = forward(head, body)
            start = await anext(answer)
        except AtCapacity as err:  # what the app itself answers when its rows and queue are full
            return error(429, f"the server is at capacity: every replica holds as many requests as it may ({err})",
                         headers={"Retry-After": "1"})
        except Exception as err:  # noqa: BLE001 -- no answer began: the request may be retried as a whole
            log.warning("relay: %s", lost(err))
            return error(503, lost(err), headers={"Retry-After": "1"})
        headers = {k: v for k, v in start["headers"] if k.lower() != "content-length"}
        if not headers.get("content-type", "").startswith("text/event-stream"):
            try:
                content = b"".join([chunk async for chunk in answer])
            except Exception as err:  # noqa: BLE001
                return error(503, lost(err), headers={"Retry-After": "1"})
            return Response(content, status_code=start["status"], headers=headers)
        return StreamingResponse(_stream(answer), status_code=start["status"], headers=headers)

    return app


async def _stream(answer: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    try:
        async for chunk in answer:
            yield chunk
    except Exception as err:  # noqa: BLE001 -- the stream has begun: the error goes in it, then [DONE]
        log.warning("relay: %s", lost(err))
        body = error_body(lost(err), "server_shutting_down", code="replica_lost")
        yield f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n".encode()
