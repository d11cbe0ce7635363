"""The generate loop's host work a step, counted in tensor operations (each costs the host microseconds and,
on a GPU, may be a launch): at B = 1 with the SLM writing every token the loop itself stays at a dozen.

Stand-in lanes make every lane call free, so only the loop, the step, the policy and the stopping check
are counted. Counts, not times: the same on any machine."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList

from hf_rstitch.core.policies import EntropyPolicy
from hf_rstitch.core.roles import Role
from hf_rstitch.core.trace import solo_calls
from hf_rstitch.decode.loop import stitch_loop
from hf_rstitch.hf.decode import quick_stopping

VOCAB, PROMPT = 64, 8


class _StandIn:
    """A lane whose calls cost nothing: fixed logits, entropy and greedy token; runs ahead like the fast lane."""

    run_ahead, capacity = True, None

    def __init__(self, role: Role):
        self.role, self.vocab, self.seen = role, VOCAB, 0
        self.logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(0))
        self.h, self.top = torch.tensor([0.25]), self.logits.argmax(-1)
        self.solo = [0]

    def advance(self, seq, mask, rows, resumed, want_hidden=False):
        self.seen = seq.shape[1]
        return self.logits, None, self.account(self.seen, rows, resumed)

    def account(self, total, rows, resumed):
        calls = solo_calls(self.role, total, rows.tolist(), self.solo, [0], resumed.tolist())
        self.solo = [total if r in calls else s for r, s in enumerate(self.solo)]
        return calls

    def entropy(self, logits):
        return self.h

    def greedy(self, logits):
        return self.top

    def keep_rows(self, index):
        pass

    def reset(self):
        self.seen, self.solo = 0, [0]


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def _run(new: int):
    lanes = {Role.SLM: _StandIn(Role.SLM), Role.LLM: _StandIn(Role.LLM)}
    ids = torch.arange(PROMPT)[None]
    criteria = StoppingCriteriaList([MaxLengthCriteria(PROMPT + new), EosTokenCriteria(VOCAB + 1)])
    with _Count() as count:
        out = stitch_loop(lanes, ids, torch.ones_like(ids), EntropyPolicy(1.0), None,
                          quick_stopping(criteria) or criteria)
    return out, count.n


def test_the_loop_makes_about_a_dozen_tensor_operations_a_step():
    short, n_short = _run(8)
    long, n_long = _run(40)
    assert long.sequences.shape[1] == PROMPT + 40
    trace = long.traces[0]
    assert trace.roles == [Role.SLM] * 40 and trace.handovers == [False] * 40
    assert trace.entropies == [0.25] * 40 and len(trace.calls) == 40
    per_step = (n_long - n_short) / 32
    assert per_step <= 12, f"{per_step} tensor operations a step (10 when this test was written, 45 before)"
