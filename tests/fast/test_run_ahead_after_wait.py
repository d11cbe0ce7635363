"""The generate loop's next call run right after a step's one wait (``hf_rstitch.decode.loop._decided_step``): where
the LLM wrote every row and its hand-back decisions are on the device (a GPU policy's), the loop cannot know the next
step's first lane before the wait; it knows it right after, so that lane's call runs then, before the host records
the step -- except at a step where a row ends. CPU decisions are on the host, so a device is simulated
(``simulated_device.py``: the decisions a step returns count as on the device until the wait reads them) and every
output must equal the eager engine's: tokens, logits, roles, per-row forward-call records and entropies, with rows
finishing at different steps, sampling and an entropy policy. fp64 tiny models."""

import pytest
import torch

from hf_rstitch import ReplayPolicy, Role
from hf_rstitch.decode import loop
from hf_rstitch.fast import FastConfig, FastEngine
from engine_checks import assert_same_run as _same
from simulated_device import MARK, simulate_a_device
from tiny_models import left_pad, make_pair, prompt

AHEAD = FastConfig(max_bucket=4, graphs=False, run_ahead=True)
ROUTES = [["llm"] * 6 + ["slm"] * 3 + ["llm"] * 4, ["llm"] * 4 + ["slm"] * 5 + ["llm"] * 4, ["llm"] * 13]


@pytest.fixture
def after_wait(monkeypatch):
    """A simulated device, and the lanes run ahead after a step's wait (the host had read the decisions)."""
    simulate_a_device(monkeypatch, loop, "run_step", "settle")
    seen, original = [], loop.run_ahead

    def spy(lanes, out, *args, **kwargs):
        got = original(lanes, out, *args, **kwargs)
        if out.back is not None and not getattr(out.back, MARK, False) and got is not None:
            seen.append(got.role)
        return got

    monkeypatch.setattr(loop, "run_ahead", spy)
    return seen


def _generate(llm, slm, ids, engine, mask=None, **kw):
    return llm.generate(ids, attention_mask=mask if mask is not None else torch.ones_like(ids), assistant_model=slm,
                        stitch_engine=engine, return_dict_in_generate=True, **kw)


@pytest.mark.parametrize("arch", ["llama", "qwen2-full"])
def test_llm_stretches_run_the_next_lane_after_the_wait(arch, after_wait):
    """Three rows whose LLM stretches differ: inside a stretch the LLM's next call, at its end the SLM's, each after
    the wait."""
    llm, slm = make_pair(arch)
    ids, mask = left_pad([prompt(k, seed=50 + i) for i, k in enumerate([5, 8, 3])])
    kw = dict(stitch_policy=ReplayPolicy(ROUTES), max_new_tokens=13, min_new_tokens=13, output_logits=True)
    ref = _generate(llm, slm, ids, "default", mask, **kw)
    _same(_generate(llm, slm, ids, FastEngine(AHEAD), mask, **kw), ref)
    assert after_wait.count(Role.LLM) >= 3 and after_wait.count(Role.SLM) >= 1, after_wait


def test_no_call_after_the_wait_of_a_step_where_a_row_ends(after_wait):
    """The LLM alone writes every token: after every wait but the last step's (its token ends the row)."""
    llm, slm = make_pair("llama")
    ids = prompt(6)
    kw = dict(stitch_policy=ReplayPolicy(["llm"] * 7), max_new_tokens=7)
    ref = _generate(llm, slm, ids, "default", **kw)
    _same(_generate(llm, slm, ids, FastEngine(AHEAD), **kw), ref)
    assert after_wait == [Role.LLM] * 6


@pytest.mark.parametrize("logits", [False, True])
def test_rows_ending_at_different_steps_and_sampling(logits, after_wait):
    llm, slm = make_pair("llama")
    ids, mask = left_pad([prompt(k, seed=40 + i) for i, k in enumerate([6, 9, 4])])
    free = _generate(llm, slm, ids, "default", mask, stitch_policy=ReplayPolicy(ROUTES), max_new_tokens=13)
    eos = [int(free.sequences[1, ids.shape[1] + 5]), int(free.sequences[2, ids.shape[1] + 9])]
    outs = []
    for engine in ("default", FastEngine(AHEAD)):
        torch.manual_seed(5)
        outs.append(_generate(llm, slm, ids, engine, mask, stitch_policy=ReplayPolicy(ROUTES), max_new_tokens=13,
                              eos_token_id=eos, pad_token_id=2, output_logits=logits, do_sample=not logits))
    _same(outs[1], outs[0])
    assert after_wait


def test_entropy_policy(after_wait):
    from hf_rstitch.core.policies import EntropyPolicy

    llm, slm = make_pair("qwen2-full")
    ids = prompt(8)
    ref = _generate(llm, slm, ids, "default", stitch_policy=EntropyPolicy(0.7), max_new_tokens=16)
    _same(_generate(llm, slm, ids, FastEngine(AHEAD), stitch_policy=EntropyPolicy(0.7), max_new_tokens=16), ref)
    assert set(ref.stitch.roles) == {Role.SLM, Role.LLM} and after_wait


def test_a_guess_undone_at_the_wait_runs_the_slm_after_it(after_wait):
    """A lane told to guess queues the LLM's next call before the wait; at a stretch's end the wait undoes it, and the
    call after the wait is the SLM's (no second guess)."""
    import dataclasses

    llm, slm = make_pair("llama")
    ids, mask = left_pad([prompt(k, seed=50 + i) for i, k in enumerate([5, 8, 3])])
    routes = [["llm"] * 6 + ["slm"] * 3 + ["llm"] * 4] * 3  # every row's stretch ends at once: the guess undone
    kw = dict(stitch_policy=ReplayPolicy(routes), max_new_tokens=13, min_new_tokens=13, output_logits=True)
    ref = _generate(llm, slm, ids, "default", mask, **kw)
    guessing = FastEngine(dataclasses.replace(AHEAD, ahead_of_decisions=True))
    _same(_generate(llm, slm, ids, guessing, mask, **kw), ref)
    assert after_wait == [Role.SLM], after_wait
