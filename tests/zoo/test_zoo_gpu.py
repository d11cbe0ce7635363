"""The zoo on CUDA: "auto" (graphs, compile="parts") runs every proven architecture fast and equal to the eager
engine, and a real capture failure (Aria's text model copies to the host inside a CUDA graph) falls back to the eager engine with
one warning instead of raising. Marked gpu (skipped without CUDA); benchmarks/zoo.py covers the whole zoo."""

import logging

import pytest
import torch

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch.fast import engine as fast_engine
from hf_rstitch.fast import support
from zoo_models import (CASES, NEAR_CASES, build_pair, clear_of_ties, near_thresholds, observed_entropies,
                        pick_threshold, stitched, zoo)

CUDA = torch.cuda.is_available()
GPU_MARGIN = 1e-6  # see test_auto_at_thresholds_next_to_observed_entropies
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs CUDA")]


def _proven_here():
    return sorted(support.PROVEN & set(zoo())) if CUDA else []


@pytest.mark.parametrize("model_type", _proven_here())
def test_auto_runs_the_proven_architectures_fast_and_equal(model_type):
    overrides = {"sliding_window": None} if model_type == "mistral" else {}
    llm, slm = (m.cuda() for m in build_pair(model_type, **overrides))
    if support.why_not_fast(llm, slm, 3) is not None:
        pytest.skip(support.why_not_fast(llm, slm, 3))  # e.g. a compute capability not proven
    threshold = pick_threshold(slm)
    for decoding, batch in CASES:
        want = stitched(llm, slm, decoding, batch, threshold, "default")
        got = stitched(llm, slm, decoding, batch, threshold, None)
        assert torch.equal(got[0].cpu(), want[0].cpu()) and got[1] == want[1], (model_type, decoding, batch)
    assert support.failure(llm, slm) is None
    assert llm.__dict__.get(fast_engine.ATTRIBUTE), "auto kept its fast engine on the LLM"


@pytest.mark.parametrize("model_type", _proven_here())
def test_auto_at_thresholds_next_to_observed_entropies(model_type):
    """B = 3, greedy and sampled, thresholds GPU_MARGIN above and below entropies the eager engine saw: a compiled
    piece that moves an entropy by more (granitemoe's 2e-6, before regions.NOT_BIT_EQUAL) flips a hand-over here.
    Not one float32 step: on an H200 the fast kernels alone (stitch_engine="fast", no compile) move entropies by a
    few float32 steps on qwen2, phi3 and granitemoe, and auto equals the eager engine at 1e-6 on them
    (benchmarks/results/zoo_near_{byname,1e-6}_nvidia_h200.md)."""
    overrides = {"sliding_window": None} if model_type == "mistral" else {}
    llm, slm = (m.cuda() for m in build_pair(model_type, **overrides))
    if support.why_not_fast(llm, slm, 3) is not None:
        pytest.skip(support.why_not_fast(llm, slm, 3))
    middle = pick_threshold(slm)
    for decoding, batch in NEAR_CASES:
        for threshold in near_thresholds(observed_entropies(llm, slm, decoding, batch, middle), GPU_MARGIN):
            if not clear_of_ties(llm, slm, decoding, batch, threshold, GPU_MARGIN):
                continue
            want = stitched(llm, slm, decoding, batch, threshold, "default")
            got = stitched(llm, slm, decoding, batch, threshold, None)
            assert torch.equal(got[0].cpu(), want[0].cpu()) and got[1] == want[1], (model_type, decoding, threshold)
    assert support.failure(llm, slm) is None


def test_a_failing_capture_falls_back_to_the_eager_engine(monkeypatch, caplog):
    """Aria's text model copies between CPU and CUDA inside the graph capture (the GPU zoo run): were it proven,
    "auto" would still return the eager engine's tokens, warn once, and send the pair's later calls there."""
    llm, slm = (m.cuda() for m in build_pair("aria_text"))
    monkeypatch.setattr(support, "PROVEN", support.PROVEN | {"aria_text"})
    monkeypatch.setattr(support, "PROVEN_CAPABILITIES", {torch.cuda.get_device_capability()})
    threshold = pick_threshold(slm)
    want = stitched(llm, slm, "greedy", 3, threshold, "default")
    log = logging.getLogger("hf_rstitch.fast")
    log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="hf_rstitch.fast"):
            got = stitched(llm, slm, "greedy", 3, threshold, None)
    finally:
        log.removeHandler(caplog.handler)
    assert torch.equal(got[0].cpu(), want[0].cpu())
    if support.failure(llm, slm) is None:
        pytest.skip("the capture did not fail on this torch / transformers: nothing fell back")
    assert any("reruns on the eager engine" in r.getMessage() for r in caplog.records)
    assert "failed on the fast engine earlier" in support.why_not_fast(llm, slm, 3)


def test_sampling_after_an_invalidated_capture_falls_back_with_the_eager_tokens():
    """xmod's capture is invalidated by a CUDA error inside it (the H200 zoo run): "auto" (were it proven) must
    still return the eager engine's sampled tokens -- the failed capture leaves no generator stuck "capturing"
    and no capture stream current behind it (:func:`hf_rstitch.fast.graphs.recover_from_failed_capture`)."""
    llm, slm = (m.cuda() for m in build_pair("xmod"))
    threshold = pick_threshold(slm)
    want = stitched(llm, slm, "sample", 1, threshold, "default")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(support, "PROVEN", support.PROVEN | {"xmod"})
        patch.setattr(support, "PROVEN_CAPABILITIES", {torch.cuda.get_device_capability()})
        got = stitched(llm, slm, "sample", 1, threshold, None)
    assert torch.equal(got[0].cpu(), want[0].cpu()) and got[1] == want[1]
    again = stitched(llm, slm, "sample", 1, threshold, "default")  # the process still samples as before
    assert torch.equal(again[0].cpu(), want[0].cpu())
