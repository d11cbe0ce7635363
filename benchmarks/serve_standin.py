"""A stand-in for the request engine that writes tokens at a set rate, no model: the server's own ceiling.

:class:`StandinEngine` has the ``submit / cancel / step / has_work / run`` API of
:class:`~hf_rstitch.batching.requests.RequestEngine` and returns the real ``Event`` objects, one token per
running row per step, each request running to its ``max_new_tokens`` (no EOS). A step takes
``base_ms + row_ms * rows`` of wall time, of which ``host_ms`` is Python that holds the GIL -- split into
``host_slices`` pieces with the GIL released between them, as the real engine's host code releases it at every
kernel launch -- and the rest a wait that releases it (the device's time). So the engine alone reaches
``rows / step`` tokens/s (e.g. 256 rows at 16 ms a step: 16k tokens/s), and a server around it reaches that too
only if its own per-token work (event hand-over, text, JSON, SSE, its share of the GIL) keeps up.

    PYTHONPATH=. python benchmarks/serve_reasoning.py --standin --levels 1 8 64 256 --out-dir /tmp/sr
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass

from hf_rstitch.core.roles import Role
from hf_rstitch.core.trace import StitchTrace
from hf_rstitch.batching.request_types import Event, QueueFull


@dataclass
class StandinTiming:
    """How long a stand-in step takes: ``base_ms + row_ms * rows``, ``host_ms`` of it holding the GIL."""

    base_ms: float = 6.0  # a step of one row (the 7B alone at B = 1 on an H100: ~4-7 ms)
    row_ms: float = 0.04  # per running row (256 rows: 16 ms a step, 16k tokens/s)
    host_ms: float = 2.0  # Python host work a step, GIL held
    host_slices: int = 20  # the GIL is released between slices (kernel launches, device reads)

    def step_s(self, rows: int) -> float:
        return (self.base_ms + self.row_ms * rows) / 1e3


class StandinEngine:
    """Writes token ``i % 200`` as a request's ``i``-th token, roles SLM, SLM, LLM, ...; see the module docstring."""

    def __init__(self, max_batch: int, max_waiting: int | None = None, timing: StandinTiming | None = None):
        self.max_batch, self.max_waiting = max_batch, max_batch if max_waiting is None else max_waiting
        self.timing = timing or StandinTiming()
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._waiting: list = []
        self._rows: dict = {}  # request_id -> [request, tokens written]
        self._cancel: set = set()

    @property
    def capacity(self) -> int:
        return self.max_batch + self.max_waiting

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._rows)

    def has_work(self) -> bool:
        return bool(self._waiting or self._rows)

    def submit(self, request) -> str:
        if not request.input_ids or request.max_new_tokens < 1:
            raise ValueError("input_ids must be non-empty and max_new_tokens >= 1")
        with self._lock:
            held = len(self._waiting) + len(self._rows) - len(self._cancel)
            if held >= self.capacity:
                raise QueueFull(f"{held} requests in flight (limit {self.capacity}); retry later")
            if request.request_id is None:
                request.request_id = f"standin-{next(self._ids)}"
            self._waiting.append(request)
        return request.request_id

    def cancel(self, request_id: str) -> None:
        with self._lock:
            self._cancel.add(request_id)

    def step(self) -> list[Event]:
        t0 = time.perf_counter()
        events = self._admit()
        if not self._rows:
            return events
        self._host_work()
        for rid, row in list(self._rows.items()):
            events.append(self._next(rid, row))
        time.sleep(max(0.0, self.timing.step_s(len(self._rows) + sum(e.finished for e in events))
                       - (time.perf_counter() - t0)))  # the device's share: GIL released
        return events

    def run(self, requests) -> list:
        """Every request to its end (the warm-up's API); returns nothing useful."""
        for r in requests:
            self.submit(r)
        while self.has_work():
            self.step()
        return []

    def _admit(self) -> list[Event]:
        with self._lock:
            cancel, self._cancel = self._cancel, set()
            self._waiting = [r for r in self._waiting if r.request_id not in cancel]
            events = [Event(rid, None, None, True, "cancelled") for rid in cancel if self._rows.pop(rid, None)]
            while self._waiting and len(self._rows) < self.max_batch:
                r = self._waiting.pop(0)
                self._rows[r.request_id] = [r, 0]
        return events

    def _host_work(self) -> None:
        t = self.timing
        slice_s = t.host_ms / 1e3 / max(1, t.host_slices)
        for _ in range(t.host_slices):
            end = time.perf_counter() + slice_s
            while time.perf_counter() < end:  # Python holding the GIL
                pass
            time.sleep(0)  # a kernel launch: the GIL released and taken back

    def _next(self, rid: str, row: list) -> Event:
        request, n = row
        row[1] = n = n + 1
        role = Role.LLM if n % 3 == 0 else Role.SLM
        if n < request.max_new_tokens:
            return Event(rid, n % 200, role)
        del self._rows[rid]
        roles = [Role.LLM if i % 3 == 0 else Role.SLM for i in range(1, n + 1)]
        return Event(rid, n % 200, role, True, "length", trace=StitchTrace(roles=roles))
