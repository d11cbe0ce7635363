"""Speculative verification inside the LLM's runs (``stitch_speculate=k``): the same tokens, fewer LLM forwards.

Equivalences: at threshold 0 it equals the LLM alone token for token; at any threshold (and any policy) it equals
stitched decoding without speculation -- tokens, routes, entropies, scores; with an SLM that agrees with the LLM
it makes fewer LLM forwards. Several architectures: full attention (llama), sliding windows on every layer
(qwen2, window 6: the caches are cropped past the window) and a hybrid (gemma3).
"""

import copy
import statistics

import pytest
import torch

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch import Role
from hf_rstitch.core.policies import RandomPolicy
from hf_rstitch.decode import Lane
from hf_rstitch.decode.protocol import EagerEngine
from hf_rstitch.engine.config import EngineConfig
from hf_rstitch.engine.engine import choose
from hf_rstitch.engine.pair import Pair

from tiny_models import ARCHS, make_pair, prompt

N_NEW = 24


def generate(llm, slm, ids, k=0, **kw):
    kw = {"stitch_threshold": 0.3, "do_sample": False, **kw}
    return llm.generate(ids, assistant_model=slm, max_new_tokens=N_NEW, return_dict_in_generate=True,
                        stitch_speculate=k, **kw)


def thresholds(llm, slm, ids):
    """0, 1 and the deciles of both models' entropies (runs at 1 and at 0): thresholds between them mix."""
    pool = generate(llm, slm, ids, stitch_threshold=1.0).stitch.entropies
    pool += generate(llm, slm, ids, stitch_threshold=0.0).stitch.entropies
    return [0.0, 1.0] + statistics.quantiles(pool, n=10)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("k", [1, 3])
def test_threshold_zero_is_the_llm_alone(arch, k):
    llm, slm = make_pair(arch)
    ids = prompt()
    out = generate(llm, slm, ids, k, stitch_threshold=0.0)
    assert torch.equal(out.sequences, llm.generate(ids, max_new_tokens=N_NEW, do_sample=False))
    assert out.stitch.slm_tokens == 0 and out.stitch.drafted_tokens > 0


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_any_threshold_equals_stitching_without_speculation(arch):
    llm, slm = make_pair(arch)
    ids = prompt(11, seed=3)
    mixed = 0
    for tau in thresholds(llm, slm, ids):
        plain_out = generate(llm, slm, ids, stitch_threshold=tau, output_scores=True)
        fast = generate(llm, slm, ids, 4, stitch_threshold=tau, output_scores=True)
        plain = plain_out.stitch
        assert torch.equal(fast.sequences, plain_out.sequences), f"tau={tau}"
        assert fast.stitch.roles == plain.roles and fast.stitch.handovers == plain.handovers, f"tau={tau}"
        assert fast.stitch.entropies == pytest.approx(plain.entropies, abs=1e-9)
        assert all(torch.allclose(a, b, atol=1e-9) for a, b in zip(fast.scores, plain_out.scores))
        assert fast.stitch.forward_calls(Role.LLM) <= plain.forward_calls(Role.LLM)
        mixed += bool(plain.slm_tokens and plain.switches and fast.stitch.drafted_tokens)
    assert mixed, "no threshold mixed the two models with LLM runs to verify: the test would be vacuous"


@pytest.mark.parametrize("arch", ARCHS)
def test_an_agreeing_slm_saves_llm_forwards(arch):
    llm, _ = make_pair(arch)
    slm = copy.deepcopy(llm)  # drafts the LLM's own tokens: every draft is kept
    ids = prompt()
    plain = generate(llm, slm, ids, stitch_threshold=0.0).stitch
    out = generate(llm, slm, ids, 4, stitch_threshold=0.0)
    assert torch.equal(out.sequences, llm.generate(ids, max_new_tokens=N_NEW, do_sample=False))
    summary = out.stitch.summary()
    assert summary["llm_forward_calls"] < plain.summary()["llm_forward_calls"] == N_NEW
    assert summary["llm_forward_calls"] == 1 + -(-(N_NEW - 1) // 5)  # the first step, then 5 tokens a verification
    assert summary["accepted_drafts"] == summary["drafted_tokens"] > 0


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_other_policies_and_logits_processors(arch):
    llm, slm = make_pair(arch)
    ids = prompt(11, seed=5)
    extra = {"repetition_penalty": 1.3, "no_repeat_ngram_size": 3}
    for policy in (RandomPolicy(0.5, return_threshold=0.5, seed=1), RandomPolicy(0.8, return_threshold=0.2)):
        plain = generate(llm, slm, ids, stitch_policy=policy, **extra)
        fast = generate(llm, slm, ids, 3, stitch_policy=policy, **extra)
        assert torch.equal(fast.sequences, plain.sequences)
        assert fast.stitch.roles == plain.stitch.roles


def test_stops_at_max_length_and_eos():
    llm, slm = make_pair("llama")
    slm_same = copy.deepcopy(llm)
    ids = prompt()
    for n in (1, 2, 5, 7):
        out = llm.generate(ids, assistant_model=slm_same, stitch_threshold=0.0, max_new_tokens=n, do_sample=False,
                           stitch_speculate=4)
        assert torch.equal(out, llm.generate(ids, max_new_tokens=n, do_sample=False))
    eos = int(llm.generate(ids, max_new_tokens=6, do_sample=False)[0, -1])  # a token the LLM writes: end there
    plain = llm.generate(ids, max_new_tokens=N_NEW, do_sample=False, eos_token_id=eos)
    out = llm.generate(ids, assistant_model=slm_same, stitch_threshold=0.0, max_new_tokens=N_NEW, do_sample=False,
                       eos_token_id=eos, stitch_speculate=4)
    assert torch.equal(out, plain)


@pytest.mark.parametrize("arch", ARCHS)
def test_lane_crop_rolls_back(arch):
    """Advance over extra columns, crop them, advance again: the logits of a lane that never saw them."""
    llm, _ = make_pair(arch)
    seq = prompt(14, seed=2)
    mask = torch.ones_like(seq)
    every = torch.ones(1, dtype=torch.bool)
    fresh, rolled = Lane(llm, Role.LLM, 96), Lane(llm, Role.LLM, 96)
    rolled.keep_past()
    rolled.advance(seq[:, :8], mask[:, :8], every, every)
    rolled.verify(seq, mask, 3, every, every)  # reads columns 8..13
    rolled.crop(10)
    got, _ = rolled.verify(seq[:, :12], mask[:, :12], 2, every, every)
    fresh.advance(seq[:, :10], mask[:, :10], every, every)
    want = [fresh.advance(seq[:, :n], mask[:, :n], every, every)[0] for n in (11, 12)]
    assert torch.allclose(got[:, 0], want[0], atol=1e-10) and torch.allclose(got[:, 1], want[1], atol=1e-10)


def test_refused_with_a_reason():
    llm, slm = make_pair("llama")
    ids = prompt()
    with pytest.raises(ValueError, match="greedily only"):
        generate(llm, slm, ids, 2, do_sample=True)
    with pytest.raises(ValueError, match="one row at a time"):
        generate(llm, slm, torch.cat([ids, ids]), 2)
    with pytest.raises(ValueError, match="whole number"):
        generate(llm, slm, ids, -1)
    with pytest.raises(ValueError, match="eager engine only"):
        generate(llm, slm, ids, 2, stitch_engine="fast")


def test_auto_picks_the_eager_engine():
    llm, slm = make_pair("llama")
    pair = Pair.of(llm, slm)
    assert choose(pair, EngineConfig(kind="auto", speculate=3)).kind == "default"
    assert choose(pair, EngineConfig(kind="default", speculate=3)).kind == "default"
    assert choose(pair, EngineConfig.of(EagerEngine(), speculate=3)).kind == "default"
    with pytest.raises(ValueError, match="eager engine only"):
        choose(pair, EngineConfig(kind="fast", speculate=3))


ZOO_ROLLBACK = ["mistral", "gpt2", "gemma2", "lfm2"]  # sliding windows, absolute positions, convolution states


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ZOO_ROLLBACK)
def test_zoo_architectures_roll_back(model_type):
    from zoo_models import build_pair, pick_threshold

    llm, slm = build_pair(model_type)
    ids = prompt(9, seed=1)
    for tau in (0.0, pick_threshold(slm)):
        kw = {"stitch_threshold": tau, "stitch_engine": "default"}
        plain, fast = generate(llm, slm, ids, **kw), generate(llm, slm, ids, 3, **kw)
        assert torch.equal(fast.sequences, plain.sequences) and fast.stitch.roles == plain.stitch.roles, f"tau={tau}"
    alone = llm.generate(ids, max_new_tokens=N_NEW, do_sample=False)
    assert torch.equal(generate(llm, slm, ids, 3, stitch_threshold=0.0).sequences, alone)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["jamba", "recurrent_gemma"])
def test_states_that_do_not_rewind_are_refused(model_type):
    from zoo_models import build_pair

    llm, slm = build_pair(model_type)
    with pytest.raises(ValueError, match="cannot roll back .* Drop stitch_speculate"):
        generate(llm, slm, prompt(9, seed=1), 3, stitch_threshold=0.0)
