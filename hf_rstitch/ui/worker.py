"""The model worker: ``rstitch ui`` loads, warms up and runs its pairs in a second process.

The page's process then only imports Gradio and serves, on its own core, while the worker imports torch and
transformers and loads the pair on the other: the page is usable sooner, and a run's streaming never waits for the
GIL of a process that is still loading. :class:`Worker` (in the page's process) has the verbs of the in-process
:class:`~hf_rstitch.ui.pairs.Pairs` the page calls: :meth:`~Worker.start`, :meth:`~Worker.ready` (a
:class:`~hf_rstitch.ui.pair.PairInfo`) and :meth:`~Worker.frames` (:class:`~hf_rstitch.ui.frames.Frame` s, pickled
over a pipe). :func:`main` is the worker's loop: it runs those verbs on a :class:`~hf_rstitch.ui.pairs.Pairs` of its
own, each run in a thread, and sends back what they return or the message of what they raised.

A worker that dies (killed, out of memory) fails every load and run in flight with a message saying so; the next
load or run starts a new worker. Messages, page to worker: ``("load", key, router)``, ``("run", id, key, settings,
compare)``; worker to page: ``("loaded", key, info | None, error)``, ``("frame", id, frame)``, ``("end", id, error)``.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import os
import queue
import threading
from collections.abc import Iterator

from .pair import Loads, PairError, PairInfo
from .run import RunError, RunSettings

log = logging.getLogger("hf_rstitch.ui")


class Worker:
    """The page's pairs, loaded and run in a worker process (started at the first load, again after one died)."""

    def __init__(self, routers: dict | None = None):
        self.lock = threading.Lock()  # guards everything below, and sends
        self.loads = Loads(self._begin, routers, self.lock)
        self.runs: dict[int, queue.Queue] = {}
        self.ids = itertools.count()
        self.conn = None
        self.process = None

    def start(self, llm: str | None, slm: str | None, router: str | None = None) -> concurrent.futures.Future:
        """The pair's load in the worker (asked for now unless asked before): a future of its :class:`PairInfo`
        (raises as :meth:`~hf_rstitch.ui.pair.Loads.start`)."""
        return self.loads.start(llm, slm, router)

    def ready(self, llm: str | None, slm: str | None) -> PairInfo:
        """The pair's :class:`PairInfo` once it loaded and warmed up (waits for it). A failed load is forgotten.

        Raises:
            PairError: the pair cannot load, or the worker died (the message says why).
        """
        return self.loads.result(llm, slm)

    def _begin(self, key: tuple[str, str], router: str | None) -> concurrent.futures.Future:
        self._send("load", key, router)
        return concurrent.futures.Future()

    def frames(self, key: tuple[str, str], settings: RunSettings, compare: bool) -> Iterator:
        """The run's frames as the worker sends them (see :func:`hf_rstitch.ui.frames.frames`).

        Raises:
            PairError: the pair cannot load. RunError: the run failed, or the worker died (the message says why).
        """
        self.ready(*key)
        inbox: queue.Queue = queue.Queue()
        with self.lock:
            run_id = next(self.ids)
            self.runs[run_id] = inbox
            self._send("run", run_id, key, settings, compare)
        try:
            while True:
                kind, item = inbox.get()
                if kind == "end":
                    if item:
                        raise RunError(item)
                    return
                yield item
        finally:
            with self.lock:
                self.runs.pop(run_id, None)

    def close(self) -> None:
        """Stop the worker (the page's process exiting stops it too)."""
        with self.lock:
            if self.conn is not None:
                self.conn.close()
            self.process = self.conn = None  # what ends now needs no message

    def _send(self, *message) -> None:
        """Send to the worker, starting one if none runs (the caller holds the lock)."""
        if self.process is None:
            self._spawn()
        try:
            self.conn.send(message)
        except OSError as err:  # it died between two messages; the reader fails what waits on it
            log.error("rstitch ui: cannot reach the model worker: %s", err)

    def _spawn(self) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: forking a process with threads is unsafe
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=main, args=(child,), name="rstitch-ui-models", daemon=True)
        self.process.start()
        child.close()
        threading.Thread(target=self._read, args=(self.conn, self.process), daemon=True,
                         name="rstitch-ui-worker-reader").start()

    def _read(self, conn, process) -> None:
        """Hand what the worker sends to whoever waits for it, until the worker ends."""
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            with self.lock:
                self._dispatch(message)
        process.join(timeout=10)
        self._died(process)

    def _dispatch(self, message: tuple) -> None:
        kind, target, *rest = message
        if kind == "loaded":
            future = self.loads.futures.get(target)
            if future is not None and not future.done():
                info, error = rest
                if error is None:
                    future.set_result(info)
                else:
                    future.set_exception(PairError(error))
        elif target in self.runs:
            self.runs[target].put((kind, rest[0]))

    def _died(self, process) -> None:
        if not threading.main_thread().is_alive():  # the page's process is exiting and stopped it
            return
        why = (f"the model worker stopped (exit code {process.exitcode}); the server's log says why. Press Run or "
               "Load pair to start it again")
        log.error("rstitch ui: %s", why)
        with self.lock:
            if self.process is not process:
                return
            for future in self.loads.futures.values():
                if not future.done():
                    future.set_exception(PairError(why))
            self.loads.futures.clear()  # a new worker loads its pairs again
            for inbox in self.runs.values():
                inbox.put(("end", why))
            self.process = self.conn = None


def main(conn) -> None:
    """The worker process: load and run what the page asks for until the page's process goes away."""
    from .pairs import Pairs

    logging.basicConfig(level=logging.INFO, format="%(asctime)s rstitch ui worker: %(message)s")
    pairs, lock = Pairs(), threading.Lock()

    def send(*message) -> None:
        with lock:
            conn.send(message)

    while True:
        try:
            kind, *args = conn.recv()
        except (EOFError, OSError):  # the page's process ended: so does the worker, mid-run or not
            os._exit(0)
        target = _load if kind == "load" else _run
        threading.Thread(target=target, args=(pairs, send, *args), daemon=True).start()


def _load(pairs, send, key: tuple[str, str], router: str | None) -> None:
    from .frames import failure

    try:
        pairs.start(*key, router)
        send("loaded", key, pairs.ready(*key), None)
    except Exception as err:  # noqa: BLE001  (a message in the page; the worker keeps serving)
        send("loaded", key, None, failure(err))


def _run(pairs, send, run_id: int, key: tuple[str, str], settings: RunSettings, compare: bool) -> None:
    from .frames import failure

    try:
        for frame in pairs.frames(key, settings, compare):
            send("frame", run_id, frame)
    except Exception as err:  # noqa: BLE001
        send("end", run_id, failure(err))
    else:
        send("end", run_id, None)
