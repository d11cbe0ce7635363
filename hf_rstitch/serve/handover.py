"""Events from the driver thread to the handlers on the event loop, one wake-up of the loop per engine step.

The driver delivers an engine step's events one by one, on its own thread, to each request's sink. A sink that
woke the event loop per event (``call_soon_threadsafe`` per token) would cost a self-pipe write and a loop
callback per token, and a handler woken per token writes one server-sent event per token: at a few hundred rows
the event loop would hold the GIL most of the time while the driver waits for it between kernel launches. Here a
request's sink is a :class:`Mailbox`: the driver thread appends to it, and all the mailboxes of one
:class:`PostOffice` (one per event loop) that received something are woken by one loop callback, scheduled at
the first event after the last one ran. A handler takes every event that arrived since it last looked
(:meth:`Mailbox.take`) and answers them at once: when the server falls behind the engine, each write carries
several tokens instead of queueing one write per token. A :class:`Pacer` bounds the writes of all answers
together, so that the event loop's share of the GIL stays bounded however many streams are open.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any

STREAM_INTERVAL_S = 0.02  # rstitch serve's --stream-interval: an answer's writes at most this often
STREAM_WRITES_PER_S = 500.0  # its --stream-writes-per-s: all answers' writes together at most this many a second


class PostOffice:
    """The mailboxes of one event loop, and the one pending wake-up that serves them all."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._lock = threading.Lock()
        self._ready: dict[Mailbox, None] = {}  # insertion-ordered set of boxes with news
        self._scheduled = False

    def mailbox(self) -> "Mailbox":
        return Mailbox(self)

    def _post(self, box: "Mailbox") -> None:  # any thread
        with self._lock:
            self._ready[box] = None
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # the loop is closed: nobody reads these events any more
            pass

    def _wake(self) -> None:  # the loop's thread
        with self._lock:
            ready, self._ready, self._scheduled = self._ready, {}, False
        for box in ready:
            box._wake()


class Mailbox:
    """One request's events: a driver sink (``box(event)``, any thread) read on the event loop."""

    __slots__ = ("_office", "_events", "_waiter", "_final", "_final_only")

    def __init__(self, office: PostOffice):
        self._office = office
        self._events: deque = deque()
        self._waiter: asyncio.Future | None = None
        self._final = False  # the finishing event has arrived
        self._final_only = False  # the waiter wakes for the finishing event only

    def __call__(self, event: Any) -> None:
        self._events.append(event)
        self._final = self._final or event.finished
        self._office._post(self)

    @property
    def final(self) -> bool:
        """The finishing event has arrived (it may not have been taken yet)."""
        return self._final

    def take(self) -> list:
        """Every event that arrived since the last ``take``, oldest first (possibly none)."""
        out = []
        while self._events:
            out.append(self._events.popleft())
        return out

    async def wait(self, timeout_s: float | None, final_only: bool = False) -> None:
        """Until an event arrives (with ``final_only``: the finishing one) or ``timeout_s`` passes (None: no
        limit); at once if one is there already."""
        if self._final or (self._events and not final_only):
            return
        loop = asyncio.get_running_loop()
        self._final_only = final_only
        self._waiter = waiter = loop.create_future()
        timer = None if timeout_s is None else loop.call_later(max(0.0, timeout_s), _resolve, waiter)
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and (self._final or not self._final_only):
            _resolve(self._waiter)


class Pacer:
    """How long an answer that has just written waits before its next write, which then carries every token
    written meanwhile (the finishing event never waits): ``max(interval_s, open / writes_per_s)``, ``open`` the
    answers in progress. The floor keeps a few streams from writing a chunk per token (the event loop's work per
    write holds the GIL that the engine's host code needs); the share keeps all the answers together at most
    ``writes_per_s`` writes a second, however many are open (256 streams at 500 writes a second: a write every
    0.512 s each). Zeros: a write per engine step."""

    def __init__(self, interval_s: float = 0.0, writes_per_s: float = 0.0):
        if interval_s < 0 or writes_per_s < 0:
            raise ValueError(f"stream pacing must be >= 0 (0: off), got interval_s={interval_s}, "
                             f"writes_per_s={writes_per_s}")
        self.interval_s, self.writes_per_s = interval_s, writes_per_s
        self.open = 0

    def spacing(self) -> float:
        return max(self.interval_s, self.open / self.writes_per_s if self.writes_per_s > 0 else 0.0)


def _resolve(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)
