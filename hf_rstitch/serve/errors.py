"""Every error the server answers, in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.

:func:`install` gives a FastAPI app: the request body size limit (413, checked from ``Content-Length`` and
while the body arrives), handlers that turn validation errors (400, not FastAPI's 422), unknown routes
(404), wrong methods (405), unparsable bodies (400: bad UTF-8, too deep nesting) and anything unexpected
(500) into that shape, and an ``/openapi.json`` that documents exactly these answers.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

log = logging.getLogger("hf_rstitch.serve")

_KIND = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error",
         413: "invalid_request_error", 429: "rate_limit_exceeded", 503: "server_shutting_down"}


class BadRequest(ValueError):
    """A request refused with a 400 naming ``param`` (OpenAI's field of the error)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param

    def __reduce__(self):  # raised in the body reader's process, answered in the server's
        return type(self), (str(self), self.param)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body."""

    error: ErrorDetail


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "the body is malformed or asks for something this server cannot do"},
    404: {"model": ErrorResponse, "description": "unknown model name"},
    413: {"model": ErrorResponse, "description": "the body is larger than the server's limit (--max-body-bytes)"},
    429: {"model": ErrorResponse, "description": "the server holds as many requests as it may; retry after Retry-After"},
    500: {"model": ErrorResponse, "description": "decoding failed for this request"},
    503: {"model": ErrorResponse, "description": "the server is shutting down, or its KV memory could not hold this "
                                                 "request (code kv_cache_full; retry after Retry-After)"},
}


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error(status: int, message: str, kind: str | None = None, param: str | None = None, code: str | None = None,
          headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, kind or _KIND.get(status, "server_error"), param, code),
                        status_code=status, headers=headers)


class BodyLimit:
    """ASGI middleware: bodies over ``max_bytes`` get a 413 before they are read in full."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or ()).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            return await error(413, self._message(int(declared)))(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:  # FastAPI re-raises an HTTPException from the body read: our handler's 413
                raise HTTPException(413, self._message(seen))
            return message

        await self.app(scope, limited, send)

    def _message(self, size: int) -> str:
        return (f"the request body has {'at least ' if size else ''}{size} bytes; this server takes at most "
                f"{self.max_bytes} (rstitch serve --max-body-bytes)")


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` of an endpoint that reads its body itself (:mod:`.bodies`): the body ``model`` published
    as FastAPI publishes a declared one (:func:`install` adds the model to the components)."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def _add_body_models(schema: dict[str, Any], models: tuple[type[BaseModel], ...]) -> None:
    from pydantic.json_schema import models_json_schema

    _, defs = models_json_schema([(m, "validation") for m in models], ref_template="#/components/schemas/{model}")
    schema.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))


def install(app: FastAPI, max_body_bytes: int, adjust=None, bodies: tuple[type[BaseModel], ...] = ()) -> None:
    """The body limit, the error handlers and the published schema's error answers (``bodies``: the models of the
    bodies endpoints read themselves; ``adjust(schema)`` adds the app's own bounds)."""
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        param, message = validation_message(err)
        return error(400, message, param=param)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, err: HTTPException) -> JSONResponse:
        return error(err.status_code, http_message(request, err), headers=err.headers)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, err: Exception) -> JSONResponse:
        log.exception("unexpected error while answering a request")
        return error(500, f"the server failed on this request ({type(err).__name__}: {err})", kind="server_error")

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
            for ops in schema.get("paths", {}).values():
                for op in ops.values():
                    op.get("responses", {}).pop("422", None)  # validation errors are 400s (ERROR_RESPONSES)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            _add_body_models(schema, bodies)
            if adjust is not None:
                adjust(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


def http_message(request: Request, err: HTTPException) -> str:
    """What an HTTP error of the framework's (no route, a method not allowed, an unreadable body) tells the client."""
    message = str(err.detail)
    if err.status_code == 404:
        message = f"no route {request.url.path}; this server serves /v1/chat/completions, /v1/completions, " \
                  "/v1/models and /health"
    elif err.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path} (allowed: {err.headers.get('Allow')})" \
            if err.headers else f"{request.method} is not allowed on {request.url.path}"
    elif err.status_code == 400:
        message = f"{message}: send a JSON object in UTF-8 (nested at most a few hundred levels)"
    return message


def validation_message(err) -> tuple[str | None, str]:
    """The first offending field (OpenAI's ``param``) and a message naming every problem (``err``: FastAPI's
    ``RequestValidationError`` or pydantic's ``ValidationError``)."""
    parts, param = [], None
    for e in err.errors():
        loc = [str(p) for p in e.get("loc", ()) if p != "body" and not _union_tag(p)]
        if e.get("type") == "json_invalid":
            parts.append(f"the body is not valid JSON ({e.get('ctx', {}).get('error', 'decode error')})")
            continue
        where = ".".join(loc)
        param = param or where or None
        part = f"{where}: {e.get('msg')}" if where else str(e.get("msg"))
        if part not in parts:
            parts.append(part)
    return param, "invalid request body: " + "; ".join(parts)


def _union_tag(part) -> bool:
    """pydantic names the member of a union it tried (``str``, ``list[constrained-int]``) in an error's loc."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool", "dict", "list", "none")
                                      or "[" in part or part.startswith(("constrained-", "function-")))
