"""The one background thread that drives a request engine for the server.

:class:`EngineDriver` owns a :class:`~hf_rstitch.batching.requests.RequestEngine` (or anything with
its ``submit / cancel / step / has_work`` API): web handlers ``submit`` a request together with a
*sink* (a callable that receives that request's :class:`Event` objects, on the driver thread), and
the thread calls ``step()`` while there is work, routing each event to its request's sink. All
requests share the engine's continuous batch.

It adds what a server needs and the engine does not know about: a draining mode that refuses new
requests (:class:`ShuttingDown`, answered 503) while running ones finish and ends the rest with a
``cancelled`` event, and the handling of a failed ``step()``: the engine's ``StepFailed`` ends
the requests of that batch only (another engine's exception ends every request in flight); the
thread backs off before the next step (never a busy loop), logs a failure streak once, and after
``UNHEALTHY_AFTER`` failed steps in a row reports itself unhealthy until a step succeeds. The one
admission limit is the engine's (``max_batch + max_waiting``; its ``QueueFull`` is answered 429).
It knows nothing about HTTP, tokenizers or asyncio.

:func:`freeze_gc` is what a process that only serves does once its engine is built (``rstitch serve``'s one
process, a split server's engine process).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

log = logging.getLogger("hf_rstitch.serve")
UNHEALTHY_AFTER = 2  # failed steps in a row that make the driver unhealthy
BACKOFF_S = (0.05, 2.0)  # pause after a failed step: doubles per failure in a row, from .. to

Sink = Callable[[Any], None]  # receives the engine's Event objects, on the driver thread


def freeze_gc() -> int:
    """Move every object alive now out of the garbage collector's reach (``gc.freeze()``, after a collection), and
    return how many. Why: the oldest generation's collections walk every tracked object, and a process that has
    imported torch and transformers and built a pair holds ~400k of them, so under load one collection every few
    seconds stalls the engine's step for a quarter of a second (the tiny pair on the 2-core CPU box, 64 clients:
    235 ms a collection, 8 ms once frozen; the 7B pair on an H200 at 256 clients: 253 ms and 31 ms;
    benchmarks/results/gc_pauses_{cpu,nvidia_h200}.md). The objects frozen -- modules,
    weights, graphs, the imports -- live as long as the server; objects made afterwards (requests, events) are
    collected as before. For a process that serves and nothing else: in a notebook or a test, frozen objects that
    later form garbage cycles are never freed. vLLM's engine freezes after its CUDA graphs are captured, for the
    same reason."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@dataclass(frozen=True)
class StepFailure:
    """A finishing event the driver sends itself, shaped like the engine's ``Event``: ``error`` when ``step()``
    raised, ``cancelled`` when a drain ran out of time."""

    request_id: str
    error: str
    token: None = None
    role: None = None
    finished: bool = True
    finish_reason: str = "error"
    trace: None = None


class ShuttingDown(RuntimeError):
    """The server is draining: it finishes the requests it has and accepts no new ones."""


class EngineDriver:
    """Drive ``engine.step()`` on one daemon thread; route events to per-request sinks.

    Args:
        engine: a ``RequestEngine`` (``submit``, ``cancel``, ``step``, ``has_work``).
        idle_wait_s: how long the idle thread sleeps between checks (a submit wakes it at once).
    """

    def __init__(self, engine: Any, idle_wait_s: float = 0.5):
        self.engine = engine
        self._idle_wait_s = idle_wait_s
        self._sinks: dict[str, Sink] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._accepting = True
        self._stop = False
        self._thread: threading.Thread | None = None
        self.steps = 0
        self.busy_s = 0.0  # seconds the thread spent in steps, failed ones too, and handing their events on (the
        # rest: waiting for work, or backing off after a failed step)
        self.completed = 0
        self.failed_in_a_row = 0
        self.last_error: str | None = None
        self.last_error_at: float | None = None  # time.monotonic() of last_error

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

    @property
    def healthy(self) -> bool:
        return self.failed_in_a_row < UNHEALTHY_AFTER

    @property
    def capacity(self) -> int | None:
        """Requests the engine holds at most (its one admission limit); None: unbounded."""
        return getattr(self.engine, "capacity", None)

    @property
    def running(self) -> int:
        """Rows of the engine's batch."""
        return self.engine.running

    @property
    def waiting(self) -> int:
        """Requests in the engine's queue."""
        return self.engine.waiting

    @property
    def llm_calls(self) -> int | None:
        """Steps in which the LLM ran so far (:func:`llm_calls`)."""
        return llm_calls(self.engine)

    def finish(self, timeout_s: float) -> int:
        """Refuse new requests, let those in flight finish for up to ``timeout_s``, then end the rest with a
        ``cancelled`` event (their handlers answer 503). The thread keeps running. Returns how many were ended."""
        with self._lock:
            self._accepting = False
        wait_drained(self, timeout_s)
        with self._lock:
            left, self._sinks = self._sinks, {}
            for rid in left:
                self.engine.cancel(rid)
        self._wake.set()
        for rid, sink in left.items():
            _deliver(sink, StepFailure(rid, "the server shut down before this request finished; retry",
                                       finish_reason="cancelled"))
        return len(left)

    def drain(self, timeout_s: float) -> int:
        """:meth:`finish`, then stop the thread. Returns how many requests had to be cancelled."""
        left = self.finish(timeout_s)
        self._stop = True
        self._wake.set()
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, timeout_s))
        return left

    # ---- requests ----------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return len(self._sinks)

    @property
    def accepting(self) -> bool:
        return self._accepting

    def submit(self, request: Any, sink: Sink) -> str:
        """Hand ``request`` to the engine; its events go to ``sink``. Raises :class:`ShuttingDown`, the
        engine's ``QueueFull`` (at its limit), or its ``ValueError`` for bad input."""
        with self._lock:
            if not self._accepting:
                raise ShuttingDown("the server is shutting down and accepts no new requests; retry on another replica")
            rid = self.engine.submit(request)
            self._sinks[rid] = sink
        self._wake.set()
        return rid

    async def admit(self, request: Any, sink: Sink) -> str:
        """:meth:`submit` for a handler on an event loop (the interface a driver in another process shares:
        :class:`~.split.EngineClient`)."""
        return self.submit(request, sink)

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
            t0 = time.perf_counter()
            try:
                events = self.engine.step()
            except Exception as err:  # noqa: BLE001 -- one bad step must not stop the server
                self.busy_s += time.perf_counter() - t0  # a failed step was work too (its back-off is not)
                ended = getattr(err, "events", None)  # the engine's StepFailed: it ended that batch's requests
                self._failed(str(err) if ended is not None else f"{type(err).__name__}: {err}")
                if ended is not None:
                    self._dispatch(ended)
                else:  # an engine that does not say which requests failed: all in flight
                    self._fail_all(f"{type(err).__name__}: {err}")
                continue
            if self.failed_in_a_row:
                log.warning("engine steps succeed again after %d failed in a row", self.failed_in_a_row)
            self.failed_in_a_row = 0
            self.steps += 1
            self._dispatch(events)
            self.busy_s += time.perf_counter() - t0

    def _failed(self, message: str) -> None:
        """Count a failed step, log a streak once, and pause before the next step."""
        self.last_error, self.last_error_at = message, time.monotonic()
        self.failed_in_a_row += 1
        n = self.failed_in_a_row
        if n == 1:
            log.exception("engine step failed; the requests of that batch end with an error")
        elif n == UNHEALTHY_AFTER:
            log.error("engine step failed %d times in a row (%s); /health reports unhealthy until a step succeeds; "
                      "further failures are not logged", n, message)
        self._stopping.wait(min(BACKOFF_S[0] * 2 ** (n - 1), BACKOFF_S[1]))

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
        with self._lock:
            sinks, self._sinks = self._sinks, {}
            for rid in sinks:
                try:
                    self.engine.cancel(rid)
                except Exception:  # noqa: BLE001
                    log.exception("cancel(%s) failed after a failed step", rid)
        for rid, sink in sinks.items():
            _deliver(sink, StepFailure(rid, f"the engine failed while decoding this batch ({message})"))


def llm_calls(engine: Any) -> int | None:
    """Steps in which ``engine``'s LLM ran so far (its ``stats``; None for an engine that keeps none)."""
    stats = getattr(engine, "stats", None)
    return stats.get("llm_calls") if isinstance(stats, dict) else None


def _deliver(sink: Sink, event: Any) -> None:
    try:
        sink(event)
    except Exception:  # noqa: BLE001 -- e.g. the handler's event loop is gone
        log.exception("could not deliver an event for request %s", event.request_id)


def wait_drained(driver, timeout_s: float) -> None:
    """Wait up to ``timeout_s`` for ``driver``'s requests in flight to finish (or its engine to stop)."""
    deadline = time.monotonic() + timeout_s
    while driver.in_flight and time.monotonic() < deadline and driver.alive:
        time.sleep(0.02)
