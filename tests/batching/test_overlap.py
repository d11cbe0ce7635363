"""The request engine's step hides its host work behind the device's: schedule -> execute -> update, where execute
queues the device's work and returns, and the host reads the step's values (one copy) and makes its events while
the device runs the next step's first call (docs/serving.md, "The request engine").

On CPU there is no device to overlap with, so a stand-in executor simulates one: its "device" work is a sleep on a
background thread, started by ``execute`` and waited for only where the real executor reads a decision (the next
step's SLM call, which the run-ahead queued). The host's work is simulated too: the update sleeps before it runs.
With the run-ahead a step then takes about max(host, device); without it (the device waited for inside
``execute``, as when a schedule holds rows) it takes their sum; the events are the same either way. Steps followed
by a join keep the overlap where requests join ahead (the scheduler's ``join_ahead``).
"""

from __future__ import annotations

import threading
import time

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch.core.roles import Role
from hf_rstitch.batching import requests as engine_requests
from hf_rstitch.batching.executor import StepOutput
from hf_rstitch.batching.requests import Request, RequestEngine
from tiny_models import make_pair

DEVICE_S = HOST_S = 0.05  # each step's simulated device and host time
STEPS = 12


class _Run:
    def __init__(self, out: StepOutput):
        self.out = out

    def wait(self) -> StepOutput:
        return self.out  # the values' copy was queued before the early call: it is on the host already


class SimulatedDevice:
    """A stand-in for :class:`~hf_rstitch.batching.executor.Executor` whose device time is a background sleep.

    Each row writes the SLM's token ``10 + (tokens it wrote so far)``. ``ahead``: the next step's first call is
    queued at the end of ``execute`` (the real executor's run-ahead) and waited for by the next ``execute``;
    else ``execute`` waits for the step's device work before it returns."""

    def __init__(self, ahead: bool):
        self.ahead, self.pending = ahead, None

    @property
    def ran_ahead(self) -> bool:
        return self.pending is not None

    def _device(self) -> threading.Thread:
        work = threading.Thread(target=time.sleep, args=(DEVICE_S,), daemon=True)
        work.start()
        return work

    def execute(self, plan, admissible):
        if not plan.rows:
            return None
        if self.pending is not None:  # the step's first decision: the call queued early must have run
            self.pending.join()
        work = self._device()
        if self._early(admissible):
            self.pending = work  # the next step's first call: the host's update runs beside it
        else:
            work.join()
            self.pending = None
        b = len(plan.rows)
        tokens = [10 + len(row.output) for row in plan.rows]
        return _Run(StepOutput(tokens, [0.1] * b, [0.1] * b, [False] * b, [False] * b, set(), {}, []))

    def _early(self, admissible) -> bool:
        """Whether the next step's first call is queued early (else ``execute`` waits for its device work)."""
        return self.ahead and not admissible()

    def leave(self, rows, index):
        if len(index) == len(rows):
            self.pending = None  # no rows: the lanes start afresh

    def forget(self, rows):
        self.pending = None

    def check(self, rows):
        pass


def _run(monkeypatch, ahead: bool):
    """Four requests of ``STEPS`` tokens through a request engine whose executor is the stand-in: the seconds
    per step (after the first, which admits them) and every event."""
    real = engine_requests.update_from_output

    def slow_host(*args):
        time.sleep(HOST_S)  # stop checks, bookkeeping, events: simulated host work of a large batch
        return real(*args)

    monkeypatch.setattr(engine_requests, "update_from_output", slow_host)
    llm, slm = make_pair("llama")
    engine = RequestEngine.of(llm, slm, threshold=0.5, max_batch=4, engine="default")
    engine.executor = SimulatedDevice(ahead)
    for i in range(4):
        engine.submit(Request([5, 6, 7 + i], max_new_tokens=STEPS, eos_token_id=[], request_id=f"r{i}"))
    events = list(engine.step())
    start = time.perf_counter()
    while engine.has_work():
        events += engine.step()
    return (time.perf_counter() - start) / (STEPS - 1), events


def test_host_work_is_hidden_behind_the_device(monkeypatch):
    overlapped, events = _run(monkeypatch, ahead=True)
    serial, same = _run(monkeypatch, ahead=False)
    assert [(e.request_id, e.token, e.role, e.finish_reason) for e in events] == \
           [(e.request_id, e.token, e.role, e.finish_reason) for e in same]
    assert {e.request_id: e.token for e in events if e.finished} == {f"r{i}": 10 + STEPS - 1 for i in range(4)}
    assert all(e.role is Role.SLM for e in events)
    assert serial >= 0.95 * (DEVICE_S + HOST_S)  # the stand-in does cost its sum when nothing overlaps
    assert overlapped < 0.75 * (DEVICE_S + HOST_S), (overlapped, serial)  # ~ max(host, device), not the sum


class JoiningDevice(SimulatedDevice):
    """:class:`SimulatedDevice` that, where a waiting request would join at the next step, takes it now (the
    scheduler's ``join_ahead``, as the real executor does) and still queues the next call early; without
    ``join_ahead`` such a step waits for its device work, as the executor did before joins ran ahead."""

    def __init__(self, join_ahead):
        super().__init__(ahead=True)
        self.join_ahead, self.queued_early = join_ahead, 0

    def _early(self, admissible) -> bool:
        early = not admissible() or (self.join_ahead is not None and self.join_ahead() is not None)
        self.queued_early += early
        return early


def _run_joining(monkeypatch, join_ahead: bool):
    """Eight requests of 2-4 tokens through two rows (rows finish at different steps, so most steps are followed by
    a join): seconds a step, events, steps queued early, steps."""
    real = engine_requests.update_from_output

    def slow_host(*args):
        time.sleep(HOST_S)
        return real(*args)

    monkeypatch.setattr(engine_requests, "update_from_output", slow_host)
    llm, slm = make_pair("llama")
    engine = RequestEngine.of(llm, slm, threshold=0.5, max_batch=2, engine="default", join_wait=0)
    engine.executor = JoiningDevice(engine.scheduler.join_ahead if join_ahead else None)
    for i in range(8):
        engine.submit(Request([5, 6, 7 + i], max_new_tokens=2 + i % 3, eos_token_id=[], request_id=f"j{i}"))
    events, steps, start = [], 0, time.perf_counter()
    while engine.has_work():
        events += engine.step()
        steps += 1
    return (time.perf_counter() - start) / steps, events, engine.executor.queued_early, steps


def test_steps_that_admit_requests_hide_host_work_too_when_joins_run_ahead(monkeypatch):
    """A join used to cost a step its overlap (the next call waited for the step's values and the joins); joining
    ahead, every step but the last queues its next call early, and a step takes about max(host, device)."""
    ahead, events, early, steps = _run_joining(monkeypatch, join_ahead=True)
    serial, same, early_before, _ = _run_joining(monkeypatch, join_ahead=False)
    key = lambda evs: sorted((e.request_id, e.token, e.finish_reason) for e in evs)  # noqa: E731
    assert key(events) == key(same) and sum(e.finished for e in events) == 8
    assert early == steps and early_before < steps - 3  # before: each step followed by a join waited
    assert ahead < 0.85 * serial, (ahead, serial)
