"""The HTTP connections no client can hold: read deadlines and a cap on open connections.

Uvicorn times out only idle keep-alive connections: one that connects and trickles its headers or its body a
byte at a time is held for ever, and twenty thousand of them take every file descriptor the process has.
:func:`guarded_protocol` gives uvicorn (its ``http`` option) its own HTTP protocol with three limits added:

* a request's headers must arrive within ``header_timeout`` of the connection opening or of the request's
  first byte (a keep-alive connection between requests stays under uvicorn's own ``timeout_keep_alive``);
* its body within ``body_timeout`` of its headers;
* at most ``max_connections`` connections are open: one past it is answered a 503 in OpenAI's error shape and
  closed at once, before it is read.

A connection that misses a deadline is closed; a handler that was reading its body sees the client leave (no
answer, nothing logged as an error). The limits are ``rstitch serve``'s flags of those names, read from its
:class:`~.http_config.HttpConfig`. Nothing here knows the engine or the endpoints.
"""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .errors import error_body
from .http_config import HttpConfig


def _refusal(limit: int) -> bytes:
    body = json.dumps(error_body(f"the server holds {limit} open connections, its limit (rstitch serve "
                                 "--max-connections); retry after Retry-After", "server_overloaded")).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))


class GuardedProtocol(HttpToolsProtocol):
    """Uvicorn's httptools protocol with an :class:`~.http_config.HttpConfig`'s limits (set on the subclass
    :func:`guarded_protocol` makes)."""

    limits = HttpConfig()
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            transport.write(_refusal(self.limits.max_connections))
            transport.close()
            return
        self._arm(self.limits.header_timeout)

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:  # a keep-alive connection's next request: its headers from now
            self._arm(self.limits.header_timeout)

    def on_headers_complete(self) -> None:
        self._arm(self.limits.body_timeout)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()


def guarded_protocol(limits: HttpConfig) -> type[GuardedProtocol]:
    """The protocol class to hand uvicorn (``uvicorn.Config(http=...)``) for ``limits`` (its ``header_timeout``,
    ``body_timeout`` and ``max_connections``)."""
    return type("GuardedProtocol", (GuardedProtocol,), {"limits": limits})
