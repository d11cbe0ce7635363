"""Uvicorn that drains the engine before it closes connections (what ``rstitch serve`` runs).

Plain uvicorn on SIGTERM closes its listeners, waits ``timeout_graceful_shutdown`` for open
responses, cancels the handlers still running (a client then sees a cut stream, or a plain-text
500), and only then runs the app's lifespan shutdown -- too late for the driver's drain to answer
anyone. :class:`DrainingServer` first runs the driver's :meth:`~.driver.EngineDriver.finish`:
new requests get 503, running ones have ``--drain-timeout`` seconds to finish, and the rest end
with a 503 JSON error or, streaming, an error event and ``[DONE]``; then uvicorn's own shutdown
finds the responses complete.
"""

from __future__ import annotations

import asyncio
import math

import uvicorn

from .guard import guarded_protocol


class DrainingServer(uvicorn.Server):
    """A uvicorn server over an app from :func:`~.app.create_app`."""

    def __init__(self, config: uvicorn.Config):
        super().__init__(config)
        self._drained = False

    async def shutdown(self, sockets=None) -> None:
        app = self.config.app
        if not self._drained and hasattr(getattr(app, "state", None), "driver"):
            self._drained = True
            await asyncio.to_thread(app.state.driver.finish, app.state.settings.http.drain_timeout)
            await asyncio.sleep(0.05)  # the handlers write their last bytes
        await super().shutdown(sockets)


def config_for(app, host: str, port: int, log_level: str = "info") -> uvicorn.Config:
    """Uvicorn's config: the connection limits of :mod:`.guard`, and a graceful-shutdown timeout that leaves the
    answers after a drain time to be written."""
    http = app.state.settings.http  # the HttpConfig: the guard's limits and the drain time
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, http=guarded_protocol(http),
                          timeout_graceful_shutdown=math.ceil(http.drain_timeout) + 5)


def run(app, host: str, port: int, log_level: str = "info") -> None:
    """Serve ``app`` until SIGINT / SIGTERM, then drain (see the module docstring)."""
    DrainingServer(config_for(app, host, port, log_level)).run()
