"""The one background thread that drives a request engine for the server.

:class:`EngineDriver` owns a :class:`~hf_rstitch.engine.requests.RequestEngine` (or anything with
its ``submit / cancel / step / has_work`` API): web handlers ``submit`` a request together with a
*sink* (a callable that receives that request's :class:`Event` objects, on the driver thread), and
the thread calls ``step()`` while there is work, routing each event to its request's sink. All
requests share the engine's continuous batch.

It adds what a server needs and the engine does not know about: a limit on requests in flight
(:class:`QueueFull`, answered 429), a draining mode that refuses new requests (:class:`ShuttingDown`,
answered 503) while running ones finish, and isolation of a failed ``step()`` (every request then
in flight gets an ``error`` event; the thread keeps serving later requests). It knows nothing about
HTTP, tokenizers or asyncio.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

log = logging.getLogger("hf_rstitch.serve")

Sink = Callable[[Any], None]  # receives the engine's Event objects, on the driver thread


@dataclass(frozen=True)
class StepFailure:
    """The finishing event the driver sends, shaped like the engine's ``Event``, when ``step()`` raised."""

    request_id: str
    error: str
    token: None = None
    role: None = None
    finished: bool = True
    finish_reason: str = "error"
    trace: None = None


class QueueFull(RuntimeError):
    """The server holds as many requests as it may (running rows + queue); retry later."""


class ShuttingDown(RuntimeError):
    """The server is draining: it finishes the requests it has and accepts no new ones."""


class EngineDriver:
    """Drive ``engine.step()`` on one daemon thread; route events to per-request sinks.

    Args:
        engine: a ``RequestEngine`` (``submit``, ``cancel``, ``step``, ``has_work``).
        max_pending: requests in flight at most (running + waiting); more raise :class:`QueueFull`.
        idle_wait_s: how long the idle thread sleeps between checks (a submit wakes it at once).
    """

    def __init__(self, engine: Any, max_pending: int, idle_wait_s: float = 0.5):
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.engine = engine
        self.max_pending = max_pending
        self._idle_wait_s = idle_wait_s
        self._sinks: dict[str, Sink] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._accepting = True
        self._stop = False
        self._thread: threading.Thread | None = None
        self.steps = 0
        self.completed = 0
        self.last_error: str | None = None

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "EngineDriver":
        """Start the thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rstitch-engine", daemon=True)
            self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def drain(self, timeout_s: float) -> int:
        """Refuse new requests, let running ones finish for up to ``timeout_s``, cancel the rest,
        stop the thread. Returns how many requests had to be cancelled."""
        with self._lock:
            self._accepting = False
        deadline = time.monotonic() + timeout_s
        while self.in_flight and time.monotonic() < deadline and self.alive:
            time.sleep(0.02)
        with self._lock:
            left = list(self._sinks)
        for rid in left:
            self.cancel(rid)
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, timeout_s))
        return len(left)

    # ---- requests ----------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return len(self._sinks)

    @property
    def accepting(self) -> bool:
        return self._accepting

    def submit(self, request: Any, sink: Sink) -> str:
        """Hand ``request`` to the engine; its events go to ``sink``. Raises :class:`ShuttingDown`,
        :class:`QueueFull`, or the engine's ``ValueError`` for bad input."""
        with self._lock:
            if not self._accepting:
                raise ShuttingDown("the server is shutting down and accepts no new requests; retry on another replica")
            if len(self._sinks) >= self.max_pending:
                raise QueueFull(
                    f"the server is at capacity: {len(self._sinks)} requests in flight (limit {self.max_pending} = "
                    "--max-batch running + --max-queue waiting); retry later")
            rid = self.engine.submit(request)
            self._sinks[rid] = sink
        self._wake.set()
        return rid

    def cancel(self, request_id: str) -> bool:
        """Stop a request (its client went away): the engine frees its row at the next step and
        no further events are delivered. Returns False if it had already finished."""
        with self._lock:
            if self._sinks.pop(request_id, None) is None:
                return False
            self.engine.cancel(request_id)
        self._wake.set()
        return True

    # ---- the thread --------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop:
            self._wake.clear()
            if not self.engine.has_work():
                self._wake.wait(self._idle_wait_s)
                continue
            try:
                events = self.engine.step()
            except Exception as err:  # noqa: BLE001 -- one bad step must not kill the server
                log.exception("engine step failed; failing the requests in flight")
                self._fail_all(f"{type(err).__name__}: {err}")
                continue
            self.steps += 1
            self._dispatch(events)

    def _dispatch(self, events: list) -> None:
        deliveries = []
        with self._lock:
            for ev in events:
                sink = self._sinks.pop(ev.request_id, None) if ev.finished else self._sinks.get(ev.request_id)
                if sink is not None:
                    deliveries.append((sink, ev))
                    self.completed += bool(ev.finished)
        for sink, ev in deliveries:
            _deliver(sink, ev)

    def _fail_all(self, message: str) -> None:
        self.last_error = message
        with self._lock:
            sinks, self._sinks = self._sinks, {}
            for rid in sinks:
                try:
                    self.engine.cancel(rid)
                except Exception:  # noqa: BLE001
                    log.exception("cancel(%s) failed after a failed step", rid)
        for rid, sink in sinks.items():
            _deliver(sink, StepFailure(rid, f"the engine failed while decoding this batch ({message})"))


def _deliver(sink: Sink, event: Any) -> None:
    try:
        sink(event)
    except Exception:  # noqa: BLE001 -- e.g. the handler's event loop is gone
        log.exception("could not deliver an event for request %s", event.request_id)
