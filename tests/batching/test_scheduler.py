"""The scheduler alone (no model, no lane, no tensor): its step plans admit in order of arrival within the free rows
and KV blocks, skip admission while a call ran ahead, and preempt the newest rows, requeued at the head of the
queue with their prompt and what they wrote (hand-computed block counts, as in test_requests_paged)."""

import pytest

from hf_rstitch.batching.kv_budget import KVBudget
from hf_rstitch.batching.request_types import Request, RequestState, RequestStatus
from hf_rstitch.batching.scheduler import Scheduler
from hf_rstitch.core.roles import Role
from hf_rstitch.core.trace import StitchTrace


def _state(rid: str, prompt: int) -> RequestState:
    return RequestState(Request(list(range(1, prompt + 1)), max_new_tokens=50, request_id=rid), frozenset(),
                        StitchTrace())


def _scheduler(max_batch: int, blocks: int | None) -> tuple[Scheduler, dict]:
    stats = {"preempted": 0}
    return Scheduler(max_batch, None if blocks is None else KVBudget(blocks, 16), None, stats), stats


def _write(state: RequestState, tokens: list[int]) -> None:
    """What the update does for each token a row writes (the scheduler reads only its counts and output)."""
    for t in tokens:
        state.trace.roles.append(Role.SLM)
        state.output.append(t)


def test_admission_in_order_within_rows_and_not_while_a_call_ran_ahead():
    sched, _ = _scheduler(max_batch=2, blocks=None)
    states = [_state(f"r{i}", 4) for i in range(3)]
    for s in states:
        sched.add(s)
    assert not sched.schedule(admit=False).rows  # a call ran ahead: nobody joins
    plan = sched.schedule()
    assert plan.join == states[:2] and plan.rows == states[:2] and plan.leave == [] and plan.staged is None
    assert [s.status for s in states] == [RequestStatus.RUNNING] * 2 + [RequestStatus.WAITING]
    assert not sched.admissible()  # no free row
    sched.finish(states[0], "stop")
    sched.leave([0])
    assert sched.admissible() and sched.schedule().join == [states[2]]
    sched.check()


def test_blocks_bound_admission():
    sched, _ = _scheduler(max_batch=4, blocks=4)
    a, b, c = _state("a", 20), _state("b", 10), _state("c", 10)
    for s in (a, b, c):
        sched.add(s)
    plan = sched.schedule()  # a alone: 2 blocks; with b: 2 + 1 + 2 rows of headroom = 5 > 4
    assert plan.join == [a] and [s.request_id for s in sched.waiting] == ["b", "c"]
    assert not sched.admissible()
    sched.leave([0])  # a finished
    assert sched.admissible()
    assert sched.schedule().join == [b, c]  # 1 + 1 + 2 rows of headroom = 4


def test_preemption_requeues_the_newest_row_with_its_prompt_and_output():
    sched, stats = _scheduler(max_batch=4, blocks=4)
    a, b = _state("a", 14), _state("b", 14)
    for s in (a, b):
        sched.add(s)
    assert sched.schedule().join == [a, b]  # 1 + 1 blocks + 2 of headroom
    _write(a, [7, 8])
    _write(b, [5, 6, 9])  # 17 tokens each: 2 blocks each -- fits exactly
    assert sched.schedule().leave == []
    _write(a, list(range(20, 35)))  # a: 31 tokens, 2 blocks + b: 2 blocks -- still 4
    _write(b, list(range(40, 55)))  # b: 32 tokens: 3 blocks, 5 in all: the newest (b) leaves
    plan = sched.schedule(admit=False)
    assert plan.leave == [1] and plan.rows == [a] and plan.joined == [a, b] and stats["preempted"] == 1
    assert b.status is RequestStatus.WAITING and sched.waiting[0] is b
    assert b.request.input_ids == list(range(1, 15)) + [5, 6, 9] + list(range(40, 55))
    assert b.n_tokens == 32 and b.replayed == 18
    sched.check()


def test_join_pacing_rule_by_hand():
    from hf_rstitch.core.scheduling import JoinDemand, JoinPacing

    at_once, paced = JoinPacing(), JoinPacing(join_wait=3, join_group=4)
    assert at_once.join_now(JoinDemand(joinable=1, running=100, waited=0))  # the default: at once
    assert not paced.join_now(JoinDemand(joinable=3, running=10, waited=2))  # too few, not long enough
    assert paced.join_now(JoinDemand(joinable=4, running=10, waited=0))  # a group
    assert paced.join_now(JoinDemand(joinable=1, running=10, waited=3))  # waited long enough
    assert paced.join_now(JoinDemand(joinable=1, running=3, waited=0))  # nearly empty: fewer rows than a group
    assert paced.join_now(JoinDemand(joinable=1, running=0, waited=0))  # an empty batch


@pytest.mark.parametrize("kw,flag", [({"join_wait": -1}, "--join-wait"), ({"join_wait": 1.5}, "--join-wait"),
                                     ({"join_wait": True}, "--join-wait"), ({"join_group": 0}, "--join-group")])
def test_join_pacing_refuses_bad_values_naming_the_flag(kw, flag):
    from hf_rstitch.core.scheduling import JoinPacing
    from hf_rstitch.engine.config import EngineConfig

    with pytest.raises(ValueError, match=flag):
        JoinPacing(**kw)
    with pytest.raises(ValueError, match=flag):
        EngineConfig(**kw)


def _paced(max_batch: int, wait: int, group: int, n: int) -> tuple[Scheduler, dict, list[RequestState]]:
    from hf_rstitch.core.scheduling import JoinPacing

    stats = {}
    sched = Scheduler(max_batch, None, None, stats, JoinPacing(join_wait=wait, join_group=group))
    states = [_state(f"r{i}", 4) for i in range(n)]
    for s in states:
        sched.add(s)
    return sched, stats, states


def _end(sched: Scheduler, index: list[int]) -> None:
    for i in index:
        sched.finish(sched.running[i], "stop")
    sched.leave(index)


def test_paced_joins_wait_for_a_group_or_at_most_join_wait_steps():
    """Rows free one at a time: the waiting requests join when a group (3) can or after 2 held steps; an empty batch
    takes every request at once; a step without admission (a call ran ahead) counts as waited."""
    sched, stats, states = _paced(max_batch=6, wait=2, group=3, n=12)
    assert sched.schedule().join == states[:6]  # an empty batch: at once
    _end(sched, [0])  # one row free, 6 waiting: held back
    assert not sched.admissible() and sched.schedule().join == [] and stats["paced"] == 1
    _end(sched, [0])  # two free: still fewer than a group; held a second step
    assert sched.schedule().join == [] and sched.waited == 2
    assert sched.admissible()  # held 2 steps: the next step admits
    assert sched.schedule().join == states[6:8] and sched.waited == 0
    _end(sched, [0, 1, 2])  # three free at once: a group joins now
    assert sched.admissible() and sched.schedule().join == states[8:11]
    _end(sched, [0])
    assert sched.schedule(admit=False).join == [] and sched.schedule().join == []  # ran ahead, then held: 2 steps
    assert sched.schedule().join == [states[11]]
    assert stats["joins"] == 4 and stats["joined"] == 12 and stats["paced"] == 4
    sched.check()


def test_paced_joins_into_a_nearly_empty_batch_at_once():
    """Fewer running rows than a group: a lone request joins at the step it arrives (low load: no delay)."""
    sched, stats, states = _paced(max_batch=8, wait=5, group=3, n=2)
    assert sched.schedule().join == states  # two rows
    late = _state("late", 4)
    sched.add(late)
    assert sched.admissible() and sched.schedule().join == [late] and stats["paced"] == 0
