"""The engine in a process of its own, and the front ends' client of it (``rstitch serve --frontend-procs``).

:class:`EngineService` runs in the engine process beside the :class:`~.driver.EngineDriver` that steps the
engine: it accepts front ends on a local socket (``multiprocessing.connection``, a Unix socket with an
authentication key) and, for each, submits and cancels that front end's requests and sends back its requests'
events, one message per engine step (whatever arrived since the last message), with the engine's figures.
:class:`EngineClient` runs in a front end and has the driver's interface (``admit`` / ``submit`` with a sink,
``cancel``, ``finish``, ``drain``, ``alive``, ``accepting``, ``healthy``, the figures ``/health`` reads), so the
app serves it unchanged. When the engine process dies, the client ends every request in flight with an error
event and reports itself stopped; nothing waits for an answer that cannot come. Nothing here knows HTTP or the
tokenizer; docs/serving.md has the design.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import threading
import time
from collections import deque
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from ..core.roles import Role
from ..core.trace import StitchTrace
from ..batching.request_types import Event, QueueFull
from .driver import EngineDriver, ShuttingDown, Sink, StepFailure, _deliver, wait_drained

log = logging.getLogger("hf_rstitch.serve")
FIGURES_EVERY_S = 0.5  # the engine's figures reach an idle front end this often
_REFUSALS = {"QueueFull": QueueFull, "ShuttingDown": ShuttingDown, "ValueError": ValueError}


def figures(driver: EngineDriver) -> dict[str, Any]:
    """What ``/health`` reads from the engine's side, as plain data (ages, not clock readings: the clocks of two
    processes differ)."""
    at = driver.last_error_at
    return {"alive": driver.alive, "accepting": driver.accepting, "healthy": driver.healthy,
            "running": driver.running, "waiting": driver.waiting, "capacity": driver.capacity,
            "steps": driver.steps, "busy_s": driver.busy_s, "llm_calls": driver.llm_calls,
            "completed": driver.completed,
            "failed_in_a_row": driver.failed_in_a_row,
            "last_error": driver.last_error, "last_error_age": None if at is None else time.monotonic() - at}


_ROLES = (None, Role.SLM, Role.LLM)  # a token's writer as it crosses the socket: its index here


def post(conn: Connection, message: Any) -> None:
    """Send ``message`` as ``conn.send`` does (``conn.recv`` reads it), through plain pickle. ``Connection.send``
    pickles with multiprocessing's ForkingPickler, which copies its table of reducers on every message (78 of them
    once torch is imported, its tensors' shared-memory ones among them): 43 % of the link writer's GIL samples in
    the engine process, a message a step (py-spy on the CPU, the shipped pair, 1 client). A tensor, should a
    message ever carry one, then travels by value, not as a handle to shared memory."""
    conn.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))


def _item(event: Any) -> tuple:
    """The event as it crosses the socket. A token that does not finish its request (nearly every event: one a running
    row a step) as a plain tuple, ``("token", request_id, token, writer)``: pickling hundreds of dataclass
    instances a step costs the engine's process about ten times as much CPU, beside the engine's thread. Any other
    event whole, a finishing event's trace cut (:func:`_light`)."""
    if type(event) is Event and not event.finished:
        return "token", event.request_id, event.token, _ROLES.index(event.role)
    return "event", _light(event)


def _event(item: tuple) -> Any:
    """:func:`_item`'s inverse, in a front end."""
    if item[0] == "token":
        _, rid, token, writer = item
        return Event(rid, token, _ROLES[writer])
    return item[1]


def _light(event: Any) -> Any:
    """The event as it crosses the socket: a finishing event's trace cut to its roles (what ``usage`` reads)."""
    trace = getattr(event, "trace", None)
    if trace is not None and (trace.entropies or trace.calls):
        from dataclasses import replace

        return replace(event, trace=StitchTrace(roles=list(trace.roles), threshold=trace.threshold))
    return event


class EngineService:
    """In the engine process: front ends connect to ``address`` (with ``authkey``) and reach ``driver``."""

    def __init__(self, driver: EngineDriver, authkey: bytes):
        self.driver = driver
        self._listener = Listener(family="AF_UNIX", authkey=authkey)
        self._thread = threading.Thread(target=self._accept, name="rstitch-engine-service", daemon=True)

    @property
    def address(self) -> str:
        return self._listener.address

    def start(self) -> "EngineService":
        self._thread.start()
        return self

    def _accept(self) -> None:
        while True:
            try:
                conn = self._listener.accept()
            except OSError:  # closed
                return
            except Exception:  # noqa: BLE001 -- a peer that failed the handshake
                log.warning("a connection to the engine service failed its handshake")
                continue
            _Link(conn, self.driver).start()

    def close(self) -> None:
        self._listener.close()


class _Link:
    """One front end's connection, on the engine's side: a reader thread (submit, cancel) and a writer thread that
    sends the acknowledgements and events queued since its last message, with the engine's figures."""

    def __init__(self, conn: Connection, driver: EngineDriver):
        self.conn, self.driver = conn, driver
        self.outbox: deque = deque()
        self.wake = threading.Event()
        self.closed = False
        self.rids: set[str] = set()

    def start(self) -> None:
        threading.Thread(target=self._read, name="rstitch-link-read", daemon=True).start()
        threading.Thread(target=self._write, name="rstitch-link-write", daemon=True).start()

    def _sink(self, event: Any) -> None:  # the driver's thread
        if event.finished:
            self.rids.discard(event.request_id)
        self.outbox.append(_item(event))
        if not self.wake.is_set():  # a set costs a lock; the writer clears it before it empties the outbox
            self.wake.set()

    def _read(self) -> None:
        try:
            while True:
                kind, *args = self.conn.recv()
                if kind == "submit":
                    self._submit(*args)
                elif kind == "cancel":
                    self.rids.discard(args[0])
                    self.driver.cancel(args[0])
                elif kind == "bye":
                    break
        except (EOFError, OSError):
            pass
        finally:  # the front end left: its requests have nobody to answer
            self.closed = True
            for rid in list(self.rids):
                self.driver.cancel(rid)
            self.wake.set()

    def _submit(self, seq: int, request: Any) -> None:
        try:
            self.driver.submit(request, self._sink)
            self.rids.add(request.request_id)
            refusal = None
        except (QueueFull, ShuttingDown, ValueError) as err:
            kind = next((name for name, cls in _REFUSALS.items() if isinstance(err, cls)), "ValueError")
            refusal = (kind, str(err))
        self.outbox.append(("admitted", seq, refusal))
        self.wake.set()

    def _write(self) -> None:
        while not self.closed:
            self.wake.wait(FIGURES_EVERY_S)
            self.wake.clear()
            items = []
            while self.outbox:
                items.append(self.outbox.popleft())
            try:
                post(self.conn, (items, figures(self.driver)))
            except (OSError, ValueError):
                break
        self.conn.close()


class EngineClient:
    """In a front end: the engine process at ``address``, with the :class:`~.driver.EngineDriver` interface."""

    def __init__(self, address: str, authkey: bytes):
        self.address, self._authkey = address, authkey
        self._conn: Connection | None = None
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._sinks: dict[str, Sink] = {}
        self._acks: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._seq = 0
        self._accepting = True
        self._lost: str | None = None  # why the engine is gone
        self._figures: dict[str, Any] = {}
        self._figures_at = time.monotonic()
        self._reader: threading.Thread | None = None

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "EngineClient":
        if self._conn is None:
            self._conn = Client(self.address, family="AF_UNIX", authkey=self._authkey)
            self._reader = threading.Thread(target=self._read, name="rstitch-engine-client", daemon=True)
            self._reader.start()
        return self

    def finish(self, timeout_s: float) -> int:
        """As :meth:`EngineDriver.finish`, for this front end's requests."""
        self._accepting = False
        wait_drained(self, timeout_s)
        with self._lock:
            left, self._sinks = self._sinks, {}
        for rid, sink in left.items():
            self._send(("cancel", rid))
            _deliver(sink, StepFailure(rid, "the server shut down before this request finished; retry",
                                       finish_reason="cancelled"))
        return len(left)

    def drain(self, timeout_s: float) -> int:
        left = self.finish(timeout_s)
        self._send(("bye",))
        if self._reader is not None:
            self._reader.join(5.0)
        return left

    # ---- requests ----------------------------------------------------------------------------
    async def admit(self, request: Any, sink: Sink) -> str:
        """Submit ``request`` and wait for the engine's answer: raises its refusal (``QueueFull``, ``ValueError``,
        :class:`ShuttingDown`) as the driver's ``submit`` does."""
        if not self._accepting or self._lost:
            raise ShuttingDown(self._lost or "the server is shutting down and accepts no new requests; retry")
        loop = asyncio.get_running_loop()
        ack = loop.create_future()
        with self._lock:
            self._seq += 1
            seq = self._seq
            self._acks[seq] = (loop, ack)
            self._sinks[request.request_id] = sink
        if not self._send(("submit", seq, request)):
            self._forget(seq, request.request_id)
            raise ShuttingDown(self._lost or "the engine process is gone; retry on another server")
        refusal = await ack
        if refusal is not None:
            self._forget(None, request.request_id)
            kind, message = refusal
            raise _REFUSALS[kind](message)
        return request.request_id

    def cancel(self, request_id: str) -> bool:
        with self._lock:
            known = self._sinks.pop(request_id, None) is not None
        if known:
            self._send(("cancel", request_id))
        return known

    def _forget(self, seq: int | None, rid: str) -> None:
        with self._lock:
            self._acks.pop(seq, None)
            self._sinks.pop(rid, None)

    def _send(self, message: tuple) -> bool:
        try:
            with self._send_lock:
                post(self._conn, message)
            return True
        except (OSError, ValueError, AttributeError):  # closed, or never opened
            return False

    # ---- the reader thread -------------------------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                items, self._figures = self._conn.recv()
                self._figures_at = time.monotonic()
                for item in items:
                    self._take(item)
        except (EOFError, OSError):
            self._engine_lost()

    def _take(self, item: tuple) -> None:
        if item[0] == "admitted":
            _, seq, refusal = item
            with self._lock:
                loop, ack = self._acks.pop(seq, (None, None))
            if ack is not None:
                loop.call_soon_threadsafe(_settle, ack, refusal)
            return
        event = _event(item)
        with self._lock:
            sink = self._sinks.pop(event.request_id, None) if event.finished else self._sinks.get(event.request_id)
        if sink is not None:
            _deliver(sink, event)

    def _engine_lost(self) -> None:
        if self._accepting:
            log.error("the engine process closed its connection; requests in flight end with an error")
        self._lost = "the engine process exited; this server cannot decode (see /health); retry on another server"
        with self._lock:
            sinks, self._sinks = self._sinks, {}
            acks, self._acks = self._acks, {}
        for rid, sink in sinks.items():
            _deliver(sink, StepFailure(rid, "the engine process exited while decoding this request; retry"))
        for loop, ack in acks.values():
            loop.call_soon_threadsafe(_settle, ack, ("ShuttingDown", self._lost))

    # ---- what /health reads ------------------------------------------------------------------
    def _figure(self, name: str, default: Any = None) -> Any:
        return self._figures.get(name, default)

    alive = property(lambda self: self._lost is None and self._conn is not None and self._figure("alive", True))
    accepting = property(lambda self: self._accepting and self._figure("accepting", True))
    healthy = property(lambda self: self._figure("healthy", True))
    in_flight = property(lambda self: len(self._sinks))
    capacity = property(lambda self: self._figure("capacity"))
    running = property(lambda self: self._figure("running", 0))
    waiting = property(lambda self: self._figure("waiting", 0))
    steps = property(lambda self: self._figure("steps", 0))
    busy_s = property(lambda self: self._figure("busy_s", 0.0))
    llm_calls = property(lambda self: self._figure("llm_calls"))
    completed = property(lambda self: self._figure("completed", 0))
    failed_in_a_row = property(lambda self: self._figure("failed_in_a_row", 0))
    last_error = property(lambda self: self._figure("last_error"))

    @property
    def last_error_at(self) -> float | None:
        age = self._figure("last_error_age")
        return None if age is None else self._figures_at - age


def _settle(ack: asyncio.Future, refusal: Any) -> None:
    if not ack.done():
        ack.set_result(refusal)
