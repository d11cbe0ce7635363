"""The FastAPI application: OpenAI-compatible endpoints over one shared request engine.

``create_app(engine, tokenizer, settings)`` returns an ASGI app with ``GET /health``,
``GET /v1/models``, ``POST /v1/chat/completions`` and ``POST /v1/completions``. Every request
becomes one row of the engine's continuous batch (driven by :class:`~.driver.EngineDriver` on
one background thread); handlers check the body, tokenize (on a worker thread, never on the event
loop, and not at all when the prompt is too long to fit whatever it tokenizes to, or is token ids), submit, and
turn events into JSON or server-sent events. Faults stay with their request: a bad body is a 400,
an unknown model a 404, a body over the size limit a 413, a full server a 429, a draining one a
503, every one in OpenAI's error shape (:mod:`.errors`); a client that disconnects has its row
cancelled. Uvicorn, Ray Serve or any ASGI server can host the app; its lifespan starts the driver
and drains it on shutdown (``rstitch serve`` drains before uvicorn closes connections:
:mod:`.server`).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import ClientDisconnect

from ..batching.request_types import QueueFull
from ..configs import embeds
from .bodies import BodyReader
from .driver import EngineDriver, ShuttingDown
from .split import EngineClient
from .errors import ERROR_RESPONSES, BadRequest, error, install, json_body
from .handover import Pacer, PostOffice
from .http_config import HttpConfig
from .protocol import ChatCompletionRequest, CompletionRequest
from .responses import Transcript
from .streams import follow, stream_chat, stream_text, whole_response


# more flat names ServerSettings takes for HttpConfig's fields: seconds with an _s, the budget of a request naming none
SETTINGS_ALIASES = {"default_max_tokens": "max_tokens", "drain_timeout_s": "drain_timeout",
                    "stream_interval_s": "stream_interval", "header_timeout_s": "header_timeout",
                    "body_timeout_s": "body_timeout", "disconnect_poll_s": "disconnect_poll",
                    "error_ttl_s": "error_ttl"}


@embeds("http", HttpConfig, SETTINGS_ALIASES)
@dataclass
class ServerSettings:
    """What the endpoints need besides the engine and tokenizer: the HTTP side's config whole (``http``), and what
    the served pair decides. Built by :func:`~.config.settings_for`; ``ServerSettings(drain_timeout_s=1)`` also
    takes ``http``'s fields flat."""

    http: HttpConfig = field(default_factory=HttpConfig)  # rstitch serve's HTTP flags (ServeConfig.http)
    model_name: str = "rstitch"  # the id /v1/models lists and responses echo (the first of http.served_names)
    model_aliases: tuple[str, ...] = ()  # further names a request's `model` may use (others: 404)
    max_context: int | None = None  # prompt + completion tokens at most (the LLM's max_position_embeddings)
    vocab_size: int | None = None  # token ids a /v1/completions prompt may hold
    do_sample: bool = False  # sampling defaults (the LLM's generation config)
    temperature: float = 1.0
    top_p: float = 1.0
    threshold: float | None = None  # the engine's default tau, reported by /health
    router: str | None = None  # the R-Stitch+ router every request routes with (then no per-request tau)
    pin: str | None = None  # "llm" / "slm": every request decoded by that model alone; None: stitched


class UnknownModel(LookupError):
    pass


_JSON_OR_SSE = {200: {"description": "the completion (JSON), or with stream: true server-sent events "
                                     "(data: chunk lines, then data: [DONE])",
                      "content": {"application/json": {}, "text/event-stream": {}}}}


def create_app(engine: Any, tokenizer: Any, settings: ServerSettings | None = None) -> FastAPI:
    """The ASGI app serving ``engine`` (a ``RequestEngine``, or an :class:`~.split.EngineClient` of one in another
    process) with ``tokenizer``'s chat template."""
    settings = settings or ServerSettings()
    driver = engine if isinstance(engine, EngineClient) else EngineDriver(engine)
    complete = _Completions(driver, tokenizer, settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        driver.start()
        yield
        await asyncio.to_thread(driver.drain, settings.http.drain_timeout)
        complete.read_body.close()

    app = FastAPI(title="hf-rstitch", summary="R-Stitch stitched decoding behind the OpenAI API", lifespan=lifespan)
    app.state.driver, app.state.settings = driver, settings
    install(app, settings.http.max_body_bytes, lambda schema: _publish_limits(schema, settings),
            bodies=(ChatCompletionRequest, CompletionRequest))

    @app.get("/health", responses={503: {"model": dict, "description": "draining, stopped or unhealthy"}})
    async def health() -> JSONResponse:
        return _health(driver, settings)

    app.head("/health", include_in_schema=False)(health)  # load balancers' probes (uvicorn sends no body)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "hf-rstitch"}
                                           for name in (settings.model_name, *settings.model_aliases)]}

    # the bodies are read off the event loop (.bodies), not by FastAPI on it; the schema publishes them alike
    @app.post("/v1/chat/completions", responses={**_JSON_OR_SSE, **ERROR_RESPONSES},
              openapi_extra=json_body(ChatCompletionRequest))
    async def chat_completions(request: Request):
        return await complete(request, "chat")

    @app.post("/v1/completions", responses={**_JSON_OR_SSE, **ERROR_RESPONSES},
              openapi_extra=json_body(CompletionRequest))
    async def completions(request: Request):
        return await complete(request, "text")

    return app


class _Completions:
    """The two completion endpoints: check, tokenize and submit a request, then answer from its events."""

    def __init__(self, driver: EngineDriver, tokenizer: Any, settings: ServerSettings):
        self.driver, self.tokenizer, self.settings = driver, tokenizer, settings
        self.chars_per_token = (max(map(len, tokenizer.get_vocab()), default=1) if hasattr(tokenizer, "get_vocab")
                                else None)
        self.pacer = Pacer(settings.http.stream_interval, settings.http.stream_writes_per_s)
        self.read_body = BodyReader(settings.max_context)
        self.dropped_roles: tuple[str, ...] | None = None  # roles the chat template leaves out (probed on first use)
        self.offices: dict[asyncio.AbstractEventLoop, PostOffice] = {}  # one per event loop serving the app

    def post_office(self) -> PostOffice:
        loop = asyncio.get_running_loop()
        if loop not in self.offices:
            self.offices.clear()  # a new loop (tests run the app on one loop after another); a box keeps its office
            self.offices[loop] = PostOffice(loop)
        return self.offices[loop]

    async def __call__(self, request: Request, kind: str):
        driver, settings, tokenizer = self.driver, self.settings, self.tokenizer
        rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        try:
            raw = await request.body()
        except ClientDisconnect:  # it left, or missed the body deadline (serve/guard.py): nobody reads an answer
            return error(499, "client disconnected", kind="cancelled")
        try:
            body = await self.read_body(raw, request.headers.get("content-type"), kind)
            ids, notes = await asyncio.to_thread(self.prompt, body, kind)
            engine_request = build_request(body, ids, rid, settings, tokenizer)
            box = self.post_office().mailbox()
            await driver.admit(engine_request, box)
        except (UnknownModel, BadRequest, QueueFull, ShuttingDown, ValueError) as err:
            return _refusal(err)
        events = follow(driver, rid, box, request, None if body.stream else settings.http.disconnect_poll, self.pacer)
        transcript = Transcript(tokenizer, len(ids), body.stop_strings, notes)
        if body.stream:
            sse = (stream_chat if kind == "chat" else stream_text)(rid, settings.model_name, body.include_usage_chunk,
                                                                   transcript, events)
            return StreamingResponse(sse, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await whole_response(rid, kind, settings.model_name, transcript, events)


    def prompt(self, body, kind: str) -> tuple[list[int], list[str]]:
        """(token ids, notes for the answer) of a checked body; on a worker thread (tokenizing)."""
        check_model(body.model, self.settings)
        check_prompt_size(body, kind, self.settings, self.chars_per_token)
        if kind == "text":
            return text_prompt_ids(self.tokenizer, body, self.settings), []
        ids = chat_prompt_ids(self.tokenizer, body)
        if self.dropped_roles is None:
            self.dropped_roles = dropped_roles(self.tokenizer)
        return ids, dropped_note(body, self.dropped_roles)


def _health(driver: EngineDriver | EngineClient, settings: ServerSettings) -> JSONResponse:
    """``GET /health``: 200 while the driver runs, accepts and is healthy, else 503 with which of them failed."""
    ok = driver.alive and driver.accepting and driver.healthy
    status = "ok" if ok else ("stopped" if not driver.alive else "draining" if not driver.accepting else "unhealthy")
    recent = driver.last_error_at is not None and time.monotonic() - driver.last_error_at < settings.http.error_ttl
    body = {"status": status, "model": settings.model_name, "pid": os.getpid(), "threshold": settings.threshold,
            "router": settings.router, "pin": settings.pin, "running": driver.running, "waiting": driver.waiting,
            "in_flight": driver.in_flight, "max_pending": driver.capacity, "steps": driver.steps,
            "busy_s": round(driver.busy_s, 6), "llm_calls": driver.llm_calls, "completed": driver.completed,
            "failed_steps_in_a_row": driver.failed_in_a_row,
            "last_error": driver.last_error if recent else None}
    return JSONResponse(body, status_code=200 if ok else 503)


def _refusal(err: Exception) -> JSONResponse:
    """The error response of a request refused before it reached the engine's batch (checked in this order)."""
    if isinstance(err, UnknownModel):
        return error(404, str(err), kind="invalid_request_error", param="model", code="model_not_found")
    if isinstance(err, BadRequest):
        return error(400, str(err), param=err.param)
    if isinstance(err, QueueFull):
        return error(429, f"the server is at capacity: {err}", headers={"Retry-After": "1"})
    if isinstance(err, ShuttingDown):
        return error(503, str(err))
    return error(400, f"the engine refused the request: {err}")  # the engine's own validation (a ValueError)


def _publish_limits(schema: dict[str, Any], settings: ServerSettings) -> None:
    """The published schema's bounds that depend on the model: token ids below the vocabulary, max_tokens within
    the context."""
    props = {name: schema["components"]["schemas"][name]["properties"]
             for name in ("ChatCompletionRequest", "CompletionRequest")}
    if settings.max_context is not None:
        for fields in props.values():
            for name in ("max_tokens", "max_completion_tokens"):
                if name in fields:
                    fields[name]["anyOf"][0]["maximum"] = settings.max_context - 1
    if settings.vocab_size is not None:
        for member in props["CompletionRequest"]["prompt"]["anyOf"]:
            ids = member.get("items", {})
            ids = ids.get("items", ids) if ids.get("type") == "array" else ids
            if ids.get("type") == "integer":
                ids["maximum"] = settings.vocab_size - 1


# ---- request -> engine -----------------------------------------------------------------------
def check_model(name: str | None, settings: ServerSettings) -> None:
    if name is not None and name not in (settings.model_name, *settings.model_aliases):
        served = ", ".join(repr(n) for n in (settings.model_name, *settings.model_aliases))
        raise UnknownModel(f"the model {name!r} does not exist on this server; it serves {served} (GET /v1/models)")


def check_prompt_size(body, kind: str, settings: ServerSettings, chars_per_token: int | None) -> None:
    """Refuse a text prompt too long to fit the context whatever it tokenizes to, without tokenizing it: no token
    covers more than ``chars_per_token`` characters (the longest in the vocabulary)."""
    if settings.max_context is None or not chars_per_token:
        return
    if kind == "chat":
        chars = sum(len(m.text()) for m in body.messages)
    else:
        chars = len(body.prompt) if isinstance(body.prompt, str) else 0
    if chars > settings.max_context * chars_per_token:
        raise BadRequest(f"the prompt has {chars} characters, at least {chars // chars_per_token} tokens, but the model "
                         f"reads at most {settings.max_context} (its max_position_embeddings); shorten the prompt",
                         param="messages" if kind == "chat" else "prompt")


def chat_prompt_ids(tokenizer: Any, body: ChatCompletionRequest) -> list[int]:
    """The chat template applied to the messages, with the generation prompt."""
    if not getattr(tokenizer, "chat_template", None):
        raise BadRequest("this model's tokenizer has no chat template; send a raw prompt to /v1/completions instead",
                         param="messages")
    messages = body.template_messages()
    try:
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    except Exception as err:  # noqa: BLE001 -- jinja raises its own errors on messages a template refuses
        if not _unicode(messages):  # a message's other fields (name, ...) reach the template unchecked
            raise BadRequest("the messages hold a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its pair), "
                             "which is not Unicode text; send valid text", param="messages") from None
        raise BadRequest(f"the model's chat template refused these messages: {err}", param="messages") from None
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _unicode(messages: list[dict[str, Any]]) -> bool:
    try:
        json.dumps(messages, ensure_ascii=False).encode("utf-8")
        return True
    except (UnicodeEncodeError, TypeError, ValueError):
        return False


_PROBE = "rstitch-probe-7f3a"  # text no template writes by itself


def dropped_roles(tokenizer: Any) -> tuple[str, ...]:
    """The roles whose messages the chat template leaves out of the prompt (rendered with a probe text that does
    not come out); a role the template refuses is not listed (those requests get its 400)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    dropped = []
    for role in ("system", "developer", "tool"):
        messages = [{"role": role, "content": _PROBE}, {"role": "user", "content": "hi"}]
        try:
            out = render_jinja_template([messages], chat_template=tokenizer.chat_template, add_generation_prompt=True,
                                        **getattr(tokenizer, "special_tokens_map", {}))
        except Exception:  # noqa: BLE001 -- the template refuses the role itself
            continue
        if _PROBE not in str(out):
            dropped.append(role)
    return tuple(dropped)


def dropped_note(body: ChatCompletionRequest, dropped: tuple[str, ...]) -> list[str]:
    """The answer's note (its ``notes`` field) when the template left messages with text out of the prompt."""
    lost = [(f"messages.{i}", m.role) for i, m in enumerate(body.messages) if m.role in dropped and m.text()]
    if not lost:
        return []
    roles = " and ".join(dict.fromkeys(role for _, role in lost))
    return [f"this model's chat template leaves {roles} messages out of the prompt: "
            f"{', '.join(p for p, _ in lost)} did not reach the model; put their instructions in a user message"]


def text_prompt_ids(tokenizer: Any, body: CompletionRequest, settings: ServerSettings) -> list[int]:
    """A string prompt tokenized as is (one that tokenizes to nothing: the BOS token, else EOS, as OpenAI starts
    an empty prompt); a token-id prompt checked against the vocabulary."""
    if isinstance(body.prompt, str):  # valid Unicode (protocol.Text)
        ids = list(tokenizer(body.prompt)["input_ids"])
        start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        return ids or ([start] if start is not None else [])
    bad = [t for t in body.prompt if settings.vocab_size is not None and not 0 <= t < settings.vocab_size]
    if bad:
        raise BadRequest(f"prompt token ids must lie in [0, {settings.vocab_size}), got {bad[:5]}", param="prompt")
    return list(body.prompt)


def token_budget(requested: int | None, n_prompt: int, settings: ServerSettings, prompt_param: str = "prompt",
                 name: str = "max_tokens") -> int:
    """``max_tokens`` (or the field ``name``) checked against the context window; the server default when absent."""
    if settings.max_context is None:
        return requested or settings.http.max_tokens
    room = settings.max_context - n_prompt
    if room < 1:
        raise BadRequest(f"the prompt has {n_prompt} tokens but the model reads at most {settings.max_context} "
                         "(its max_position_embeddings); shorten the prompt", param=prompt_param)
    if requested is not None and requested > room:
        raise BadRequest(f"{name}={requested} plus the prompt's {n_prompt} tokens exceed the model's context of "
                         f"{settings.max_context} tokens; ask for at most {room}", param=name)
    return requested or min(settings.http.max_tokens, room)


def build_request(body, ids: list[int], request_id: str, settings: ServerSettings, tokenizer: Any = None):
    """The engine request for one HTTP request."""
    from ..batching.requests import Request as EngineRequest

    if not ids:
        raise BadRequest("the prompt tokenized to nothing; send some text", param="prompt")
    if settings.router and body.stitch_threshold is not None:
        raise BadRequest(f"this server routes every request with the R-Stitch+ router {settings.router!r} "
                         "(rstitch serve --router); drop stitch_threshold", param="stitch_threshold")
    policy = request_policy(body, settings, tokenizer)
    sampling = body.sampling(settings.do_sample, settings.temperature, settings.top_p)
    param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
    for name in ("max_tokens", "max_completion_tokens"):  # both checked, though one decides
        if getattr(body, name, None) is not None and name != body.budget_field:
            token_budget(getattr(body, name), len(ids), settings, param, name)
    budget = token_budget(body.token_budget(), len(ids), settings, param, body.budget_field)
    return EngineRequest(input_ids=ids, max_new_tokens=budget,
                         stitch_threshold=body.stitch_threshold, seed=body.engine_seed, request_id=request_id,
                         role=settings.pin, stitch_policy=policy, **sampling)


def request_policy(body, settings: ServerSettings, tokenizer: Any):
    """The request's own routing policy (``stitch_policy``), or None."""
    spec = getattr(body, "stitch_policy", None)
    if spec is None:
        return None
    if body.stitch_threshold is not None:
        raise BadRequest("stitch_policy routes this request by its own rule; drop stitch_threshold",
                         param="stitch_policy")
    from ..core.policies_rows import policy_from_spec

    try:
        return policy_from_spec(spec.model_dump(), tokenizer)
    except ValueError as err:
        raise BadRequest(str(err), param="stitch_policy") from None
