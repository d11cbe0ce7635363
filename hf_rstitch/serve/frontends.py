"""The processes of a split server (``rstitch serve --frontend-procs N``): one engine process, N front ends.

:class:`EngineProcess` starts the engine process (spawned: it loads the pair, builds the request engine, starts
the driver and the :class:`~.split.EngineService`, and says where front ends connect) and stops it.
:func:`split_app` is the app of one front end over a started engine process (what a Ray replica serves).
:func:`run_split` is what the CLI runs (by default on a CUDA device, with N = 1): it starts the engine process, binds the port,
starts N - 1 front-end processes on the same listening socket and serves as the first front end itself; on SIGTERM
or Ctrl-C each front end drains (as one process does), then the engine process stops. docs/serving.md has the
design.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import secrets
import signal
import socket
import traceback
from typing import Any, Callable

log = logging.getLogger("hf_rstitch.serve")
READY_TIMEOUT_S = 600.0  # loading a pair onto a GPU may take minutes


def build_from_config(cfg) -> tuple[Any, Any]:
    """``(request engine, ServerSettings)`` for a :class:`~.config.ServeConfig`: the engine process's build."""
    import hf_rstitch  # noqa: F401  (registers stitched generate)

    from .config import build_parts, load_models

    llm, slm, _ = load_models(cfg)
    return build_parts(cfg, llm, slm)


def engine_main(build: Callable[[], tuple[Any, Any]], authkey: bytes, pipe) -> None:
    """The engine process: build, then serve front ends until the supervisor says stop (or is gone)."""
    from .driver import EngineDriver, freeze_gc
    from .split import EngineService

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group: the supervisor stops us
    try:
        engine, settings = build()
    except Exception:  # noqa: BLE001 -- the supervisor reports it
        pipe.send(("failed", traceback.format_exc()))
        return
    freeze_gc()  # the process serves and nothing else: its start-up objects out of the collector's walks
    driver = EngineDriver(engine).start()
    service = EngineService(driver, authkey).start()
    pipe.send(("ready", service.address, settings))
    try:
        timeout = pipe.recv()  # "stop" with the drain timeout
    except EOFError:  # the supervisor died
        timeout = 0.0
    service.close()
    driver.drain(float(timeout))
    logging.shutdown()
    os._exit(0)  # drained; the interpreter's own exit can wait on the service's threads (blocked in accept / recv)


class EngineProcess:
    """The engine process of a split server, built by ``build`` (a picklable callable) in a spawned process."""

    def __init__(self, build: Callable[[], tuple[Any, Any]]):
        self.build, self.authkey = build, secrets.token_bytes(32)
        self.address: str | None = None
        self.settings: Any = None
        ctx = multiprocessing.get_context("spawn")
        self._pipe, child = ctx.Pipe()
        self.process = ctx.Process(target=engine_main, args=(build, self.authkey, child), name="rstitch-engine")

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> "EngineProcess":
        """Start the engine process and wait until it has loaded (:meth:`launch`, then :meth:`wait_ready`)."""
        return self.launch().wait_ready(timeout_s)

    def launch(self) -> "EngineProcess":
        """Start the engine process, not waiting: the caller may load its own side meanwhile."""
        self.process.start()
        return self

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> "EngineProcess":
        if not self._pipe.poll(timeout_s):
            self.process.kill()
            raise RuntimeError(f"the engine process did not load within {timeout_s:.0f} s")
        message = self._pipe.recv()
        if message[0] != "ready":
            self.process.join(5)
            raise RuntimeError(f"the engine process failed to start:\n{message[1]}")
        _, self.address, self.settings = message
        return self

    def client(self):
        from .split import EngineClient

        return EngineClient(self.address, self.authkey)

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def stop(self, drain_timeout_s: float = 0.0) -> None:
        """Let the engine finish what its front ends left (they drained first), then end the process."""
        try:
            self._pipe.send(drain_timeout_s)
        except OSError:
            pass
        self.process.join(drain_timeout_s + 10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)


def split_app(cfg) -> tuple[Any, EngineProcess]:
    """``(app, engine process)``: the engine of ``cfg`` (a :class:`~.config.ServeConfig`) in a process of its own,
    started, and the app over its client in this process (what a Ray replica and the tests serve)."""
    from functools import partial

    from .app import create_app

    engine = EngineProcess(partial(build_from_config, cfg)).start()
    return create_app(engine.client(), load_tokenizer(cfg), engine.settings), engine


def load_tokenizer(cfg):
    """The LLM's tokenizer, from where :func:`~.config.load_models` loads the LLM (no weights)."""
    from transformers import AutoTokenizer

    from ..resources import resolve

    return AutoTokenizer.from_pretrained(resolve(cfg.llm or "shipped:llm"))


def frontend_main(cfg, address: str, authkey: bytes, settings, sock: socket.socket, on_exit=None,
                  tokenizer=None) -> None:
    """A front-end process: the app over an :class:`~.split.EngineClient`, uvicorn on the shared socket;
    ``on_exit()`` runs once it has drained (before uvicorn re-raises the signal that stopped it)."""
    from .app import create_app
    from .server import config_for
    from .split import EngineClient

    app = create_app(EngineClient(address, authkey), tokenizer or load_tokenizer(cfg), settings)
    _FrontEnd(config_for(app, cfg.http.host, cfg.http.port), on_exit).run(sockets=[sock])


def _front_end_class():
    from .server import DrainingServer

    class FrontEnd(DrainingServer):
        """The draining server, with ``on_exit`` run after it drained, inside uvicorn's signal capture."""

        def __init__(self, config, on_exit=None):
            super().__init__(config)
            self.on_exit = on_exit

        @contextlib.contextmanager
        def capture_signals(self):
            with super().capture_signals():
                try:
                    yield
                finally:
                    if self.on_exit is not None:
                        self.on_exit()

    return FrontEnd


def _FrontEnd(config, on_exit=None):  # noqa: N802 -- uvicorn is imported only where a front end runs
    return _front_end_class()(config, on_exit)


def listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def run_split(cfg) -> int:
    """``rstitch serve --frontend-procs N``: see the module docstring."""
    from functools import partial

    engine = EngineProcess(partial(build_from_config, cfg)).launch()
    try:  # while the engine process loads the pair: the tokenizer and the web stack's imports
        tokenizer = load_tokenizer(cfg)
        from . import app as _app, server as _server  # noqa: F401
        engine.wait_ready()
    except BaseException:
        engine.process.kill()
        raise
    log.info("engine process %d ready; %d front-end process(es)", engine.pid, cfg.frontend_procs)
    sock = listening_socket(cfg.http.host, cfg.http.port)
    ctx = multiprocessing.get_context("spawn")
    others = [ctx.Process(target=frontend_main, args=(cfg, engine.address, engine.authkey, engine.settings, sock),
                          name=f"rstitch-frontend-{i + 1}") for i in range(cfg.frontend_procs - 1)]
    for proc in others:
        proc.start()

    def stop_the_rest():  # this front end has drained: the others drain theirs, then the engine stops
        for proc in others:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGTERM)
        for proc in others:
            proc.join(cfg.http.drain_timeout + 10)
        engine.stop(0.0)

    try:
        frontend_main(cfg, engine.address, engine.authkey, engine.settings, sock, on_exit=stop_the_rest,
                      tokenizer=tokenizer)
    finally:
        if engine.process.is_alive():  # the server failed to start, or returned without a signal
            stop_the_rest()
    return 0
