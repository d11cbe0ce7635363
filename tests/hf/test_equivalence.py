"""Stitched generate equals its limits (SLM alone, LLM alone) and a cache-free reference."""

import statistics

import pytest
import torch

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch import Role

from reference import reference_stitch
from tiny_models import ARCHS, make_pair, prompt

N_NEW = 24


def mixed_thresholds(llm, slm, ids, limit=3):
    """Thresholds (deciles of both models' solo entropies) at which the stitched run really mixes:
    both models write tokens and control changes hands (most switches first). The tests are vacuous
    without them."""
    pool = stitched(llm, slm, ids, 1.0).stitch.entropies + stitched(llm, slm, ids, 0.0).stitch.entropies
    found = []
    for tau in statistics.quantiles(pool, n=10):
        t = stitched(llm, slm, ids, tau).stitch
        if t.llm_tokens and t.slm_tokens and t.switches:
            found.append((t.switches, tau))
    assert found, "no threshold mixes the two models; the tiny models need a wider entropy spread"
    return [tau for _, tau in sorted(found, reverse=True)[:limit]]  # most switches first


def stitched(llm, slm, ids, tau, **kw):
    return llm.generate(ids, assistant_model=slm, stitch_threshold=tau, max_new_tokens=N_NEW, do_sample=False,
                        return_dict_in_generate=True, **kw)


@pytest.mark.parametrize("arch", ARCHS)
def test_threshold_one_is_the_slm_alone(arch):
    llm, slm = make_pair(arch)
    ids = prompt()
    out = stitched(llm, slm, ids, 1.0)
    assert torch.equal(out.sequences, slm.generate(ids, max_new_tokens=N_NEW, do_sample=False))
    assert out.stitch.llm_tokens == 0 and out.stitch.switches == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_threshold_zero_is_the_llm_alone(arch):
    llm, slm = make_pair(arch)
    ids = prompt()
    out = stitched(llm, slm, ids, 0.0)
    assert torch.equal(out.sequences, llm.generate(ids, max_new_tokens=N_NEW, do_sample=False))
    assert out.stitch.slm_tokens == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_intermediate_thresholds_equal_cache_free_reference(arch):
    llm, slm = make_pair(arch)
    ids = prompt(11, seed=3)
    for tau in mixed_thresholds(llm, slm, ids):
        out = stitched(llm, slm, ids, tau)
        ref_seq, ref_roles = reference_stitch(llm, slm, ids, tau, N_NEW)
        assert torch.equal(out.sequences, ref_seq), f"tau={tau}"
        assert out.stitch.roles == ref_roles, f"tau={tau}"


@pytest.mark.parametrize("arch", ARCHS)
def test_each_call_reads_exactly_the_unseen_tokens(arch):
    llm, slm = make_pair(arch)
    ids = prompt(11, seed=4)
    tau = mixed_thresholds(llm, slm, ids, limit=1)[0]
    trace = stitched(llm, slm, ids, tau).stitch
    assert trace.switches > 0
    seen = {Role.SLM: 0, Role.LLM: 0}
    emitted = 0
    for call in trace.calls:
        current = ids.shape[1] + emitted
        assert call.n_kv == seen[call.role]  # the cache holds exactly what the lane processed before
        assert call.n_kv + call.n_inf == current  # ...and it now reads only the tokens it has not seen
        seen[call.role] = current
        discarded = call.role is Role.SLM and trace.handovers[emitted]
        if not discarded:
            emitted += 1
    assert emitted == trace.n_tokens
    assert trace.partial_prefill_tokens(Role.SLM) > 0  # the SLM caught up on LLM tokens at least once
