"""A real server on 127.0.0.1 (an ephemeral port) in a thread, as ``rstitch serve`` runs it (uvicorn that
drains the engine first), for tests that need real connections: client disconnects, graceful shutdown,
concurrency."""

from __future__ import annotations

import threading
import time

from hf_rstitch.serve.server import DrainingServer, config_for


class LiveServer:
    def __init__(self, app, graceful_s: float | None = None):
        config = config_for(app, "127.0.0.1", 0, log_level="warning")
        if graceful_s is not None:
            config.timeout_graceful_shutdown = int(graceful_s)
        self.server = DrainingServer(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = ""

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start within 10 s")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self, wait_s: float = 15.0) -> None:
        """What SIGTERM does: drain the engine, stop accepting, finish open responses, run the lifespan shutdown."""
        self.server.should_exit = True
        self.thread.join(wait_s)

    def __exit__(self, *exc) -> None:
        self.stop()
