"""A real uvicorn server on 127.0.0.1 (an ephemeral port) in a thread, for tests that need real
connections: client disconnects, graceful shutdown, concurrency."""

from __future__ import annotations

import threading
import time

import uvicorn


class LiveServer:
    def __init__(self, app, graceful_s: float = 10.0):
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                timeout_graceful_shutdown=int(graceful_s))
        self.server = uvicorn.Server(config)
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
        """What SIGTERM does: stop accepting, finish open responses, run the lifespan shutdown."""
        self.server.should_exit = True
        self.thread.join(wait_s)

    def __exit__(self, *exc) -> None:
        self.stop()
