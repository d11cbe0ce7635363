"""A stand-in for the request engine that writes tokens at a set rate, no model: the server's own ceiling.

:class:`StandinEngine` has the ``submit / cancel / step / has_work / run`` API of
:class:`~hf_rstitch.batching.requests.RequestEngine` and returns the real ``Event`` objects, one token per
running row per step, each request running to its ``max_new_tokens`` (no EOS). Requests are admitted by the request
engine's own :class:`~hf_rstitch.batching.scheduler.Scheduler` (in order of arrival into free rows; with a
:class:`~hf_rstitch.core.scheduling.JoinPacing`, in groups). A step takes ``base_ms + row_ms * rows`` of wall
time, plus ``join_ms + join_row_ms * joiners`` at a step that admits requests (their prefill: one join call, a weight
read of each model), of which ``host_ms`` is Python that holds the GIL -- split into ``host_slices`` pieces with the
GIL released between them, as the real engine's host code releases it at every kernel launch -- and the rest a wait
that releases it (the device's time). So the engine alone reaches ``rows / step`` tokens/s (e.g. 256 rows at 16 ms
a step: 16k tokens/s), and a server around it reaches that too only if its own per-token work (event hand-over,
text, JSON, SSE, its share of the GIL) keeps up.

    PYTHONPATH=. python benchmarks/serve_reasoning.py --standin --levels 1 8 64 256 --out-dir /tmp/sr
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass

from hf_rstitch.batching.request_types import Event, QueueFull, RequestState
from hf_rstitch.batching.scheduler import Scheduler
from hf_rstitch.core.roles import Role
from hf_rstitch.core.scheduling import JoinPacing
from hf_rstitch.core.trace import StitchTrace


@dataclass
class StandinTiming:
    """How long a stand-in step takes: ``base_ms + row_ms * rows``, ``host_ms`` of it holding the GIL."""

    base_ms: float = 6.0  # a step of one row (the 7B alone at B = 1 on an H100: ~4-7 ms)
    row_ms: float = 0.04  # per running row (256 rows: 16 ms a step, 16k tokens/s)
    host_ms: float = 2.0  # Python host work a step, GIL held
    host_slices: int = 20  # the GIL is released between slices (kernel launches, device reads)
    join_ms: float = 0.0  # a step that admits requests: their join call (7B + 1.5B weights on an H200: ~3.5 ms)
    join_row_ms: float = 0.0  # per joining request (its prompt's compute)

    def step_s(self, rows: int, joiners: int = 0) -> float:
        join = self.join_ms + self.join_row_ms * joiners if joiners else 0.0
        return (self.base_ms + self.row_ms * rows + join) / 1e3


class StandinEngine:
    """Writes token ``i % 200`` as a request's ``i``-th token, roles SLM, SLM, LLM, ...; see the module docstring."""

    def __init__(self, max_batch: int, max_waiting: int | None = None, timing: StandinTiming | None = None,
                 pacing: JoinPacing | None = None):
        self.max_batch, self.max_waiting = max_batch, max_batch if max_waiting is None else max_waiting
        self.timing = timing or StandinTiming()
        self.stats = {"steps": 0}
        self.scheduler = Scheduler(max_batch, None, None, self.stats, pacing)
        self._ids = itertools.count()

    @property
    def capacity(self) -> int:
        return self.max_batch + self.max_waiting

    @property
    def waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def running(self) -> int:
        return len(self.scheduler.running)

    def has_work(self) -> bool:
        return bool(self.scheduler.running or self.scheduler.waiting)

    def submit(self, request) -> str:
        if not request.input_ids or request.max_new_tokens < 1:
            raise ValueError("input_ids must be non-empty and max_new_tokens >= 1")
        sched = self.scheduler
        with sched.lock:
            held = len(sched.states) - len(sched.cancelled & sched.states.keys())
            if held >= self.capacity:
                raise QueueFull(f"{held} requests in flight (limit {self.capacity}); retry later")
            if request.request_id is None:
                request.request_id = f"standin-{next(self._ids)}"
            sched.add(RequestState(request, frozenset(), StitchTrace()))
        return request.request_id

    def cancel(self, request_id: str) -> None:
        with self.scheduler.lock:
            self.scheduler.cancelled.add(request_id)

    def step(self) -> list[Event]:
        t0 = time.perf_counter()
        sched = self.scheduler
        events, gone = sched.take_cancelled()
        sched.leave(gone)
        plan = sched.schedule()
        if not plan.rows:
            return events
        self.stats["steps"] += 1
        self._host_work()
        done = []
        for i, row in enumerate(plan.rows):
            events.append(self._next(row))
            if events[-1].finished:
                done.append(i)
        sched.leave(done)
        time.sleep(max(0.0, self.timing.step_s(len(plan.rows), len(plan.join))
                       - (time.perf_counter() - t0)))  # the device's share: GIL released
        return events

    def run(self, requests) -> list:
        """Every request to its end (the warm-up's API); returns nothing useful."""
        for r in requests:
            self.submit(r)
        while self.has_work():
            self.step()
        return []

    def _host_work(self) -> None:
        t = self.timing
        slice_s = t.host_ms / 1e3 / max(1, t.host_slices)
        for _ in range(t.host_slices):
            end = time.perf_counter() + slice_s
            while time.perf_counter() < end:  # Python holding the GIL
                pass
            time.sleep(0)  # a kernel launch: the GIL released and taken back

    def _next(self, row: RequestState) -> Event:
        roles = row.trace.roles
        n = len(roles) + 1
        roles.append(Role.LLM if n % 3 == 0 else Role.SLM)
        if n < row.request.max_new_tokens:
            return Event(row.request_id, n % 200, roles[-1])
        return self.scheduler.finish(row, "length", token=n % 200)
