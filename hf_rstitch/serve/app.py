"""The FastAPI application: OpenAI-compatible endpoints over one shared request engine.

``create_app(engine, tokenizer, settings)`` returns an ASGI app with ``GET /health``,
``GET /v1/models``, ``POST /v1/chat/completions`` and ``POST /v1/completions``. Every request
becomes one row of the engine's continuous batch (driven by :class:`~.driver.EngineDriver` on
one background thread); handlers only tokenize, submit, and turn events into JSON or server-sent
events. Faults stay with their request: a bad body is a 400, a full server a 429, a draining one
a 503, and a client that disconnects has its row cancelled. Uvicorn, Ray Serve or any ASGI
server can host the app; its lifespan starts the driver and drains it on shutdown.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from .driver import EngineDriver, QueueFull, ShuttingDown
from .protocol import ChatCompletionRequest, CompletionRequest
from .responses import (Transcript, chat_body, chat_chunk, completion_body, completion_chunk, error_body,
                        usage_chunk)


@dataclass
class ServerSettings:
    """What the endpoints need besides the engine and tokenizer."""

    model_name: str = "rstitch"  # the id /v1/models lists and responses echo
    default_max_tokens: int = 256  # budget of a request that names none
    max_context: int | None = None  # prompt + completion tokens at most (the LLM's max_position_embeddings)
    vocab_size: int | None = None  # token ids a /v1/completions prompt may hold
    max_pending: int = 64  # requests in flight at most (running rows + queue); more get 429
    drain_timeout_s: float = 30.0  # on shutdown, how long running requests may take to finish
    do_sample: bool = False  # sampling defaults (the LLM's generation config)
    temperature: float = 1.0
    top_p: float = 1.0
    threshold: float | None = None  # the engine's default tau, reported by /health
    router: str | None = None  # the R-Stitch+ router every request routes with (then no per-request tau)
    disconnect_poll_s: float = 0.25  # how often a waiting handler checks that its client is still there


class BadRequest(ValueError):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def create_app(engine: Any, tokenizer: Any, settings: ServerSettings | None = None) -> FastAPI:
    """The ASGI app serving ``engine`` (a ``RequestEngine``) with ``tokenizer``'s chat template."""
    settings = settings or ServerSettings()
    driver = EngineDriver(engine, settings.max_pending)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        driver.start()
        yield
        await asyncio.to_thread(driver.drain, settings.drain_timeout_s)

    app = FastAPI(title="hf-rstitch", summary="R-Stitch stitched decoding behind the OpenAI API", lifespan=lifespan)
    app.state.driver, app.state.settings = driver, settings

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        return _error(400, _validation_message(err))

    @app.get("/health")
    async def health() -> JSONResponse:
        ok = driver.alive and driver.accepting
        body = {"status": "ok" if ok else ("draining" if driver.alive else "stopped"), "model": settings.model_name,
                "pid": os.getpid(), "threshold": settings.threshold, "router": settings.router, "running": engine.running, "waiting": engine.waiting,
                "in_flight": driver.in_flight, "max_pending": driver.max_pending, "steps": driver.steps,
                "completed": driver.completed, "last_error": driver.last_error}
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": settings.model_name, "object": "model", "created": 0,
                                            "owned_by": "hf-rstitch"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await _complete(request, body, "chat")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await _complete(request, body, "text")

    async def _complete(request: Request, body, kind: str):
        rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        try:
            ids = chat_prompt_ids(tokenizer, body) if kind == "chat" else text_prompt_ids(tokenizer, body, settings)
            engine_request = build_request(body, ids, rid, settings)
            queue: asyncio.Queue = asyncio.Queue()
            loop = asyncio.get_running_loop()
            driver.submit(engine_request, lambda ev: loop.call_soon_threadsafe(queue.put_nowait, ev))
        except BadRequest as err:
            return _error(400, str(err), param=err.param)
        except QueueFull as err:
            return _error(429, str(err), kind="rate_limit_exceeded", headers={"Retry-After": "1"})
        except ShuttingDown as err:
            return _error(503, str(err), kind="server_shutting_down")
        except ValueError as err:  # the engine's own validation
            return _error(400, f"the engine refused the request: {err}")
        events = follow(driver, rid, queue, request, settings.disconnect_poll_s)
        transcript = Transcript(tokenizer, len(ids))
        if body.stream:
            sse = stream_chat(rid, body, transcript, events, settings) if kind == "chat" else \
                stream_text(rid, body, transcript, events, settings)
            return StreamingResponse(sse, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await whole_response(rid, kind, transcript, events, settings)

    return app


# ---- request -> engine -----------------------------------------------------------------------
def chat_prompt_ids(tokenizer: Any, body: ChatCompletionRequest) -> list[int]:
    """The chat template applied to the messages, with the generation prompt."""
    if not getattr(tokenizer, "chat_template", None):
        raise BadRequest("this model's tokenizer has no chat template; send a raw prompt to /v1/completions instead",
                         param="messages")
    try:
        out = tokenizer.apply_chat_template(body.template_messages(), add_generation_prompt=True, tokenize=True)
    except Exception as err:  # noqa: BLE001 -- jinja raises its own errors on messages a template refuses
        raise BadRequest(f"the model's chat template refused these messages: {err}", param="messages") from None
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def text_prompt_ids(tokenizer: Any, body: CompletionRequest, settings: ServerSettings) -> list[int]:
    """A string prompt tokenized as is; a token-id prompt checked against the vocabulary."""
    if isinstance(body.prompt, str):
        return list(tokenizer(body.prompt)["input_ids"])
    bad = [t for t in body.prompt if settings.vocab_size is not None and not 0 <= t < settings.vocab_size]
    if bad:
        raise BadRequest(f"prompt token ids must lie in [0, {settings.vocab_size}), got {bad[:5]}", param="prompt")
    return list(body.prompt)


def token_budget(requested: int | None, n_prompt: int, settings: ServerSettings, prompt_param: str = "prompt") -> int:
    """``max_tokens`` checked against the context window; the server default when absent."""
    if settings.max_context is None:
        return requested or settings.default_max_tokens
    room = settings.max_context - n_prompt
    if room < 1:
        raise BadRequest(f"the prompt has {n_prompt} tokens but the model reads at most {settings.max_context} "
                         "(its max_position_embeddings); shorten the prompt", param=prompt_param)
    if requested is not None and requested > room:
        raise BadRequest(f"max_tokens={requested} plus the prompt's {n_prompt} tokens exceed the model's context of "
                         f"{settings.max_context} tokens; ask for at most {room}", param="max_tokens")
    return requested or min(settings.default_max_tokens, room)


def build_request(body, ids: list[int], request_id: str, settings: ServerSettings):
    """The engine request for one HTTP request."""
    from ..engine.requests import Request as EngineRequest

    if not ids:
        raise BadRequest("the prompt tokenized to nothing; send some text", param="prompt")
    if settings.router and body.stitch_threshold is not None:
        raise BadRequest(f"this server routes every request with the R-Stitch+ router {settings.router!r} "
                         "(rstitch serve --router); drop stitch_threshold", param="stitch_threshold")
    sampling = body.sampling(settings.do_sample, settings.temperature, settings.top_p)
    param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
    return EngineRequest(input_ids=ids, max_new_tokens=token_budget(body.token_budget(), len(ids), settings, param),
                         stitch_threshold=body.stitch_threshold, seed=body.seed, request_id=request_id, **sampling)


# ---- events -> responses ---------------------------------------------------------------------
async def follow(driver: EngineDriver, rid: str, queue: asyncio.Queue, request: Request,
                 poll_s: float) -> AsyncIterator[Any]:
    """This request's events until the finishing one; cancels the row if the client leaves first
    (noticed by polling, or by the server cancelling this generator)."""
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


async def whole_response(rid: str, kind: str, tr: Transcript, events, settings: ServerSettings) -> JSONResponse:
    """The non-streaming answer once the request has finished (or an error saying why it did not)."""
    async for ev in events:
        tr.add(ev)
    if tr.finish_reason is None:  # the client left; nobody reads this
        return _error(499, "client disconnected", kind="cancelled")
    if tr.finish_reason == "error":
        return _error(500, tr.error or "decoding failed", kind="server_error")
    if tr.finish_reason == "cancelled":
        return _error(503, "the server shut down before this request finished; retry", kind="server_shutting_down")
    build = chat_body if kind == "chat" else completion_body
    return JSONResponse(build(rid, settings.model_name, tr))


def _sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


async def stream_chat(rid: str, body, tr: Transcript, events, settings: ServerSettings) -> AsyncIterator[str]:
    created, model = int(time.time()), settings.model_name
    yield _sse(chat_chunk(rid, model, created, {"role": "assistant", "content": ""}))
    async for ev in events:
        delta = tr.add(ev)
        if ev.finished:
            if ev.finish_reason in ("error", "cancelled"):
                yield _sse(error_body(ev.error or "the server stopped this request", "server_error"))
                return
            if delta:
                yield _sse(chat_chunk(rid, model, created, {"content": delta}))
            yield _sse(chat_chunk(rid, model, created, {}, tr.finish_reason, tr.usage()))
            if body.include_usage_chunk:
                yield _sse(usage_chunk(rid, "chat.completion.chunk", model, created, tr.usage()))
            yield _sse("[DONE]")
        elif delta:
            yield _sse(chat_chunk(rid, model, created, {"content": delta}))


async def stream_text(rid: str, body, tr: Transcript, events, settings: ServerSettings) -> AsyncIterator[str]:
    created, model = int(time.time()), settings.model_name
    async for ev in events:
        delta = tr.add(ev)
        if ev.finished:
            if ev.finish_reason in ("error", "cancelled"):
                yield _sse(error_body(ev.error or "the server stopped this request", "server_error"))
                return
            yield _sse(completion_chunk(rid, model, created, delta, tr.finish_reason, tr.usage()))
            if body.include_usage_chunk:
                yield _sse(usage_chunk(rid, "text_completion", model, created, tr.usage()))
            yield _sse("[DONE]")
        elif delta:
            yield _sse(completion_chunk(rid, model, created, delta))


def _error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, kind, param), status_code=status, headers=headers)


def _validation_message(err: RequestValidationError) -> str:
    parts = []
    for e in err.errors():
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body")
        parts.append(f"{where}: {e.get('msg')}" if where else str(e.get("msg")))
    return "invalid request body: " + "; ".join(parts)
