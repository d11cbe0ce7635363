"""The generate loop's host work a step, counted in tensor operations (each costs the host microseconds and,
on a GPU, may be a launch): at B = 1 with the SLM writing every token the loop itself stays at a dozen.

Stand-in lanes make every lane call free, so only the loop, the step, the policy and the stopping check
are counted. Counts, not times: the same on any machine."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList

from hf_rstitch.core.policies import EntropyPolicy
from hf_rstitch.core.roles import Role
from hf_rstitch.decode.loop import stitch_loop
from hf_rstitch.hf.decode import quick_stopping

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from host_standin import StandIn, aten_ops  # noqa: E402  (the stand-in lanes of engine_profile.py --host-cpu)

VOCAB, PROMPT = 64, 8


def _run(new: int):
    lanes = {role: StandIn(role, vocab=VOCAB, entropy=0.25) for role in (Role.SLM, Role.LLM)}
    ids = torch.arange(PROMPT)[None]
    criteria = StoppingCriteriaList([MaxLengthCriteria(PROMPT + new), EosTokenCriteria(VOCAB + 1)])
    n, out = aten_ops(lambda: stitch_loop(lanes, ids, torch.ones_like(ids), EntropyPolicy(1.0), None,
                                          quick_stopping(criteria) or criteria))
    return out, n


def test_the_loop_makes_about_a_dozen_tensor_operations_a_step():
    short, n_short = _run(8)
    long, n_long = _run(40)
    assert long.sequences.shape[1] == PROMPT + 40
    trace = long.traces[0]
    assert trace.roles == [Role.SLM] * 40 and trace.handovers == [False] * 40
    assert trace.entropies == [0.25] * 40 and len(trace.calls) == 40
    per_step = (n_long - n_short) / 32
    assert per_step <= 12, f"{per_step} tensor operations a step (10 when this test was written, 45 before)"
