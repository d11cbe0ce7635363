"""The zoo suite: every causal LM transformers ships, as a tiny random float32 pair, on the fast engine's static-
cache path (``FastConfig(graphs=False)``, the CPU) against the eager engine: B = 1 and B = 3 left padded, greedy
and seeded sampling, at a threshold where routes mix (:func:`zoo_models.pick_threshold`).

Every architecture ends in one of two rows: the fast path gives the eager engine's tokens and routes, or the fast
engine refuses it by name with a reason (and ``"auto"`` runs it on the eager engine, saying why). No crash, no
other tokens. Architectures that cannot be built as a text-only decoder pair are listed, with the reason, in
:data:`zoo_models.EXCLUDED`. The GPU counterpart (CUDA graphs, ``compile="parts"``, timings) is
``benchmarks/zoo.py``.
"""

import logging
import warnings

import pytest
import torch

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch.fast import FastConfig, check_supported, support
from zoo_models import (CASES, EXCLUDED, NEAR_CASES, NotBuildable, build_pair, clear_of_ties, near_thresholds,
                        observed_entropies, pick_threshold, stitched, zoo)

pytestmark = pytest.mark.slow
STATIC = FastConfig(graphs=False)
AUTO_LIKE = FastConfig(graphs=False, warm_up=True)  # "auto" on the CPU's static path (its compiles: the GPU tier)
# the CPU static path's entropies differ from the eager engine's by up to ~4e-7 (another attention arithmetic; on
# CUDA the fast kernels move them by a few float32 steps and tests/zoo/test_zoo_gpu.py places thresholds 1e-6 away)
CPU_MARGIN = 2e-6


@pytest.fixture(autouse=True)
def quiet():
    logging.disable(logging.WARNING)  # the zoo's configs warn about their own defaults
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    logging.disable(logging.NOTSET)


def refusal(llm, slm) -> str | None:
    """What ``stitch_engine="fast"`` by name says for this pair: None where it runs."""
    try:
        check_supported(llm)
        check_supported(slm)
    except ValueError as err:
        return str(err)
    return None


@pytest.mark.parametrize("model_type", [t for t in zoo() if t not in EXCLUDED])
def test_fast_path_equals_eager_or_is_refused(model_type):
    try:
        llm, slm = build_pair(model_type)
    except NotBuildable as err:
        pytest.fail(f"{model_type} no longer builds as a tiny pair ({err}); fix tests/zoo_models.py or list it in "
                    "EXCLUDED with the reason")
    reason = refusal(llm, slm)
    auto = support.why_not_fast(llm, slm)
    assert auto, "on the CPU auto always runs the eager engine, with a reason"
    if model_type in support.PROVEN and reason is None:
        assert "not been proven" not in auto
    threshold = pick_threshold(slm)
    mixed, ran = set(), 0
    for decoding, batch in CASES:
        try:
            eager = stitched(llm, slm, decoding, batch, threshold, "default")
        except Exception:  # noqa: BLE001  the eager engine itself fails here: nothing for auto to keep working
            continue
        ran += 1
        mixed |= {r for roles in eager[1] for r in roles}
        if reason is not None:
            with pytest.raises(ValueError, match="fast engine"):
                stitched(llm, slm, decoding, batch, threshold, STATIC)
            continue
        fast = stitched(llm, slm, decoding, batch, threshold, STATIC)
        assert torch.equal(fast[0], eager[0]), f"{model_type} {decoding} B={batch}: other tokens"
        assert fast[1] == eager[1], f"{model_type} {decoding} B={batch}: other routes"
    assert ran, f"{model_type}: the eager engine fails in every case; list it in EXCLUDED with the reason"
    assert mixed == {"slm", "llm"}, f"{model_type}: routes do not mix at {threshold}"


def test_proven_architectures_build_and_run_on_the_fast_path():
    """Every type auto runs fast is in this transformers' zoo (where the suite above proves it), unless this
    transformers predates it."""
    known = set(zoo())
    assert not (support.PROVEN & set(EXCLUDED)), "a proven architecture must be built by the suite"
    for model_type in sorted(support.PROVEN & known):
        overrides = {"sliding_window": None} if model_type == "mistral" else {}
        llm, slm = build_pair(model_type, **overrides)
        assert refusal(llm, slm) is None, model_type


@pytest.mark.parametrize("model_type", [t for t in zoo() if t not in EXCLUDED])
def test_auto_like_config_at_thresholds_next_to_observed_entropies(model_type):
    """B = 3, greedy and sampled, thresholds just above and below entropies the eager engine saw (CPU_MARGIN away,
    and clear of every entropy its own run meets, :func:`zoo_models.clear_of_ties`): the hand-overs must fall as
    the eager engine's, so the tokens and routes are its."""
    try:
        llm, slm = build_pair(model_type)
    except NotBuildable as err:
        pytest.skip(str(err))
    if refusal(llm, slm) is not None:
        pytest.skip(refusal(llm, slm))
    middle = pick_threshold(slm)
    decided = 0
    for decoding, batch in NEAR_CASES:
        try:
            seen = observed_entropies(llm, slm, decoding, batch, middle)
        except Exception:  # noqa: BLE001  the eager engine itself fails here (the test above covers it)
            continue
        for threshold in near_thresholds(seen, CPU_MARGIN):
            if not clear_of_ties(llm, slm, decoding, batch, threshold, CPU_MARGIN):
                continue
            decided += 1
            eager = stitched(llm, slm, decoding, batch, threshold, "default")
            fast = stitched(llm, slm, decoding, batch, threshold, AUTO_LIKE)
            where = f"{model_type} {decoding} B={batch} threshold {threshold!r}"
            assert torch.equal(fast[0], eager[0]) and fast[1] == eager[1], where
    assert decided or not seen, f"{model_type}: every threshold next to an entropy met another within {CPU_MARGIN}"
