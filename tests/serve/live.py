"""A real server on 127.0.0.1 (an ephemeral port) in a thread, as ``rstitch serve`` runs it (uvicorn that
drains the engine first), for tests that need real connections: client disconnects, graceful shutdown,
concurrency."""

from __future__ import annotations

import contextlib
import threading
import time

from hf_rstitch.serve.server import DrainingServer, config_for

# ``rstitch serve``'s two layouts: the engine in a process of its own (the default on a CUDA device; a second Python
# to start: minutes on a busy 2-core box, hence ``start_cli_server``'s timeout), and everything in one process
LAYOUTS = {"split": ("--frontend-procs", "1"), "one-process": ("--frontend-procs", "0")}


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


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cli_server(*args: str, timeout: float = 400):
    """``rstitch serve --port P *args`` in a subprocess on the shipped pair (offline, one thread), once its
    /health answers 200: ``(process, url)``; stdout and stderr merged into ``process.stdout``."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "hf_rstitch.cli.main", "serve", "--port", str(port), *args],
                            cwd=Path(__file__).resolve().parents[2], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.3)
    return proc, url


@contextlib.contextmanager
def split_app(cfg, timeout_s: float = 300):
    """The app of ``cfg`` (a ``ServeConfig``) as ``rstitch serve`` builds it by default: the engine in a spawned
    engine process (``build_from_config``), the app over its client; the engine process is stopped on exit."""
    from hf_rstitch.serve.frontends import split_app as build

    app, engine = build(cfg)
    try:
        yield app
    finally:
        engine.stop()
