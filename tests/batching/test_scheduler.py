"""The scheduler alone (no model, no lane, no tensor): its step plans admit in order of arrival within the free rows
and KV blocks, skip admission while a call ran ahead, and preempt the newest rows, requeued at the head of the
queue with their prompt and what they wrote (hand-computed block counts, as in test_requests_paged)."""

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
