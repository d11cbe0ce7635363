"""EngineDriver without HTTP: event routing, the in-flight limit, cancel, drain, failed steps."""

from __future__ import annotations

import threading

import pytest

from hf_rstitch.batching.requests import QueueFull, Request
from hf_rstitch.serve.driver import EngineDriver, ShuttingDown
from serve.fake_engine import FakeEngine
from serve.helpers import EOS, SCRIPT


class Collect:
    def __init__(self):
        self.events, self.done = [], threading.Event()

    def __call__(self, ev):
        self.events.append(ev)
        if ev.finished:
            self.done.set()


def test_events_reach_their_own_sinks_in_order():
    driver = EngineDriver(FakeEngine(SCRIPT, eos=EOS, max_batch=2, max_waiting=6)).start()
    sinks = [Collect() for _ in range(3)]
    rids = [driver.submit(Request([5, 6], max_new_tokens=n), s) for n, s in zip((3, 10, 5), sinks)]
    assert all(s.done.wait(5) for s in sinks)
    for rid, sink, n in zip(rids, sinks, (3, 10, 5)):
        assert {e.request_id for e in sink.events} == {rid}
        assert [e.token for e in sink.events] == (SCRIPT + [EOS])[:n]
        assert [e.finished for e in sink.events] == [False] * (n - 1) + [True]
    assert driver.in_flight == 0 and driver.completed == 3
    assert driver.drain(1) == 0 and not driver.alive


def test_limit_cancel_and_drain():
    engine = FakeEngine(SCRIPT * 50, eos=EOS, max_batch=1, step_s=0.01, max_waiting=1)  # the one limit: 2
    driver = EngineDriver(engine).start()
    a, b = Collect(), Collect()
    ra = driver.submit(Request([5]), a)
    driver.submit(Request([6]), b)
    with pytest.raises(QueueFull, match=r"2 requests in flight \(limit 2"):
        driver.submit(Request([7]), Collect())
    assert driver.cancel(ra) and not driver.cancel(ra)
    driver.submit(Request([8]), Collect())  # the cancelled request's place is free again
    assert driver.drain(timeout_s=0.05) == 2  # the two left could not finish in time: cancelled
    assert not driver.alive and not a.done.is_set()
    with pytest.raises(ShuttingDown):
        driver.submit(Request([9]), Collect())


def test_bad_input_raises_at_submit_and_counts_nothing():
    driver = EngineDriver(FakeEngine(SCRIPT, eos=EOS, max_batch=1, max_waiting=0)).start()
    with pytest.raises(ValueError, match="non-negative token ids"):
        driver.submit(Request([-1]), Collect())
    ok = Collect()
    driver.submit(Request([5]), ok)
    assert ok.done.wait(5) and ok.events[-1].finish_reason == "stop"
    driver.drain(1)


def test_failed_step_fails_in_flight_requests_and_the_thread_goes_on():
    driver = EngineDriver(FakeEngine(SCRIPT, eos=EOS, poison=99)).start()
    bad = Collect()
    driver.submit(Request([99]), bad)
    assert bad.done.wait(5)
    (ev,) = bad.events
    assert ev.finish_reason == "error" and "RuntimeError: poisoned batch" in ev.error
    good = Collect()
    driver.submit(Request([5]), good)
    assert good.done.wait(5) and good.events[-1].finish_reason == "stop"
    assert driver.last_error == "RuntimeError: poisoned batch"
    driver.drain(1)


def test_freeze_gc_takes_the_objects_alive_now_out_of_collections_and_leaves_the_collector_on():
    """What rstitch serve's process does once its engine is built (serve.driver.freeze_gc): a collection first (no
    garbage frozen), then every object alive moved to the permanent generation; later objects are collected as before."""
    import gc
    import weakref

    from hf_rstitch.serve.driver import freeze_gc

    class Cycle:
        pass

    try:
        garbage = Cycle()
        garbage.me = garbage  # a cycle: only the collector frees it
        gone = weakref.ref(garbage)
        del garbage
        frozen = freeze_gc()
        # frozen objects may die after the count (another thread's, e.g. xdist's link): never more, never none
        assert frozen >= gc.get_freeze_count() > 0 and gc.isenabled()
        assert gone() is None  # collected before the freeze, not frozen
        later = Cycle()
        later.me = later
        assert any(o is later for o in gc.get_objects())  # made after: tracked, collectable
    finally:
        gc.unfreeze()  # the test process goes on as before
