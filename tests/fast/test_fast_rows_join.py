"""FastLane's continuous-batching verbs (rows join, the shared columns grow and shrink on the left):
after every step each live row's logits equal a plain forward over that row's real tokens alone,
and an added row's calls are counted as in its solo run. CPU, fp64 tiny models, no graphs."""

import pytest
from lane_batch import Batch
from tiny_models import make_pair

from hf_rstitch import Role
from hf_rstitch.core.trace import CallKind
from hf_rstitch.fast import FastConfig, FastLane

CPU = FastConfig(max_bucket=4, graphs=False)


def test_rows_join_and_leave_and_match_their_solo_forwards():
    llm, _ = make_pair("qwen2-full")
    lane = FastLane(llm, Role.LLM, 96, capacity=64, config=CPU, max_rows=4)
    b = Batch(lane)
    b.join([5, 3])  # nothing seen yet: the first advance reads both prompts
    logits, _, calls = b.append(1)
    b.check(logits, llm)
    assert [(c.kind, c.n_inf, c.n_kv) for c in calls.values()] == [(CallKind.PREFILL, 6, 0), (CallKind.PREFILL, 4, 0)]
    b.check(b.append(2)[0], llm)
    b.join([11])  # longer than the 8 shared columns: 3 masked columns in front of the first two rows
    assert b.seq.shape[1] == 11 and lane.seen == 11
    logits, _, calls = b.append(1)
    b.check(logits, llm)
    assert calls[2].kind is CallKind.PREFILL and (calls[2].n_inf, calls[2].n_kv) == (12, 0)  # as if alone
    assert (calls[0].kind, calls[0].n_inf, calls[0].n_kv) == (CallKind.DECODE, 1, 8)
    b.join([2])  # a short one: no new columns, a fourth cache row
    b.check(b.append(3)[0], llm)
    assert b.keep([0, 1, 3]) == 3  # the long row leaves; the 3 columns of padding all others share go
    b.check(b.append(1)[0], llm)
    b.join([6])  # fills the freed cache row: max_rows = 4 live rows
    assert sorted(lane.rows.slot) == [0, 1, 2, 3]
    b.check(b.append(2)[0], llm)
    with pytest.raises(ValueError, match="holds 4 rows, 4 are live: no room for 1 more"):
        b.join([3])
