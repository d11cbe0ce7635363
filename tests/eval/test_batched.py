"""Batched evaluation: each batched record equals the same problem run alone; sweep's summaries."""

from __future__ import annotations

import pytest
import torch

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch.eval.batched import as_problems, batched_records, summarize, sweep
from hf_rstitch.eval.data import prompt_ids
from hf_rstitch.eval.methods import GenSettings, build_methods

ROWS = [{"id": str(i), "problem": p, "answer": "2"} for i, p in
        enumerate(["What is 1+1?", "Add 3 and 4, then 5.", "x", "How many legs do two birds have?"])]
KEYS = ("new_tokens", "llm_tokens", "slm_tokens", "switches", "output", "correct", "extracted", "hit_eos")


def test_each_batched_record_equals_its_problem_alone(pair, tokenizer):
    llm, slm = pair
    methods = build_methods(["llm", "slm", "specdec", "rstitch"], llm, slm, GenSettings(max_new_tokens=12),
                            thresholds=[0.9987])  # random weights: normalized entropies near 1
    problems = as_problems(ROWS)
    records = batched_records(methods, problems, tokenizer, batch_size=3)
    assert [(r["method"], r["id"]) for r in records] == [(m.name, p.id) for m in methods for p in problems]
    assert [r["batch_size"] for r in records[:4]] == [3, 3, 3, 1]
    assert {r["batch_size"] for r in records if r["kind"] == "specdec"} == {1}  # assisted generation: batch 1
    for rec in records:
        method = next(m for m in methods if m.name == rec["method"])
        ids = torch.tensor([prompt_ids(tokenizer, ROWS[int(rec["id"])]["problem"], "")])
        new, counts = method.run(ids)
        assert rec["new_tokens"] == len(new) and rec["output"] == tokenizer.decode(new, skip_special_tokens=True)
        assert {k: rec[k] for k in ("llm_tokens", "slm_tokens", "switches")} == \
            {k: counts[k] for k in ("llm_tokens", "slm_tokens", "switches")}, rec["method"]
    stitched = [r for r in records if r["kind"] == "rstitch"]
    assert any(r["llm_tokens"] for r in stitched) and any(r["slm_tokens"] for r in stitched)  # both models wrote


def test_sweep_is_summarize_of_batched_records(pair, tokenizer):
    llm, slm = pair
    rows = sweep(llm, slm, tokenizer, ROWS, [0.0, 1.0], methods=["rstitch"], settings=GenSettings(max_new_tokens=6),
                 batch_size=4)
    assert [r["method"] for r in rows] == ["rstitch@0", "rstitch@1"]
    assert rows[0]["llm_token_share"] == 1.0 and rows[1]["llm_token_share"] == 0.0  # tau 0: LLM alone; 1: SLM
    assert all(r["n"] == len(ROWS) for r in rows)


def test_summarize_hand_values():
    recs = [{"method": "m", "kind": "rstitch", "param": 0.1, "correct": c, "new_tokens": n, "llm_tokens": l,
             "slm_tokens": n - l, "switches": s, "latency_s": 2.0, "batch_size": 2}
            for c, n, l, s in [(True, 10, 2, 1), (False, 30, 6, 3)]]
    (row,) = summarize(recs)
    assert row == {"method": "m", "kind": "rstitch", "param": 0.1, "n": 2, "accuracy": 0.5, "new_tokens": 20.0,
                   "llm_tokens": 4.0, "slm_tokens": 16.0, "switches": 2.0, "llm_token_share": 0.2, "wall_s": 2.0}


def test_latency_model_estimates_stitched_rows():
    class Flat:  # 1 ms per forward call
        def predict_trace(self, trace):
            return float(len(trace["calls"]))

    recs = [{"method": "m", "kind": "rstitch", "param": 0.1, "correct": True, "new_tokens": 1, "llm_tokens": 0,
             "slm_tokens": 1, "switches": 0, "latency_s": 1.0, "trace": {"calls": [0] * k}} for k in (2, 4)]
    assert summarize(recs, Flat())[0]["latency_ms"] == pytest.approx(3.0)


def test_latency_model_estimates_the_llm_alone_from_its_lengths():
    """The LLM alone records no trace: its latency is a prefill of the prompt, then one step a token after the
    first (what ``rstitch tune`` divides by for a speed-up)."""
    class Flat:  # 1 ms per forward call
        def predict_trace(self, trace):
            return float(len(trace["calls"]))

    recs = [{"method": "llm", "kind": "llm", "param": None, "correct": True, "new_tokens": n, "llm_tokens": n,
             "slm_tokens": 0, "switches": 0, "latency_s": 1.0, "prompt_tokens": 5} for n in (3, 5)]
    assert summarize(recs, Flat())[0]["latency_ms"] == pytest.approx(4.0)  # 3 and 5 calls
    assert "latency_ms" not in summarize(recs)[0]
