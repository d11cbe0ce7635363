"""Grading, and the shipped pair: it loads and solves test problems (skipped if absent)."""

import pytest

from hf_rstitch.toyworld.pair import assets_present, extract_boxed, grade


def test_grade_reads_the_last_boxed_answer():
    assert extract_boxed("a \\boxed{12} then \\boxed{ 305 }") == "305"
    assert extract_boxed("no answer") is None
    assert grade("The answer is \\boxed{305}", "305")
    assert grade("The answer is \\boxed{0305}", 305)
    assert not grade("The answer is \\boxed{306}", "305")
    assert not grade("The answer is 305", "305")


@pytest.mark.slow  # 20 s
@pytest.mark.skipif(not assets_present(), reason="shipped toy-world pair absent")
def test_shipped_pair_loads_and_solves_test_problems():
    import torch

    from hf_rstitch.toyworld.evaluate import evaluate
    from hf_rstitch.toyworld.pair import load_pair, load_test_split

    llm, slm, tok = load_pair("cpu")
    assert llm.dtype == slm.dtype == torch.float32
    n_llm, n_slm = (sum(p.numel() for p in m.parameters()) for m in (llm, slm))
    assert n_llm > 5 * n_slm
    rows = load_test_split()[:4]
    ev_llm = evaluate(llm, tok, rows, batch_size=4)
    ev_slm = evaluate(slm, tok, rows, batch_size=4)
    assert ev_llm["accuracy"] == 1.0, [r["text"] for r in ev_llm["results"]]
    assert all(extract_boxed(r["text"]) is not None for r in ev_slm["results"])
    assert ev_slm["mean_tokens"] < 0.6 * ev_llm["mean_tokens"]
