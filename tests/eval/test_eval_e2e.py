"""End to end on tiny random in-process models: evaluate() -> records -> report.

Greedy speculative decoding must reproduce LLM-only output token for token; stitching at
the extreme thresholds (tau = 0: every SLM proposal handed over; tau = 1: never) and random
routing at p = 1 / p = 0 must reproduce LLM-only / SLM-only.
"""

from __future__ import annotations

import json

import pytest

import hf_rstitch
from hf_rstitch.eval import EvalConfig, evaluate

STITCHING = hasattr(hf_rstitch, "stitched_decode")


def _cfg(tmp_path, bench_file, methods, **kw):
    return EvalConfig(llm="tiny-llm", slm="tiny-slm", data=[str(bench_file)], methods=methods, max_new_tokens=12,
                      out=str(tmp_path / "out"), progress=False, **kw)


@pytest.fixture(scope="module")
def pair64(pair):
    llm, slm = pair
    return llm.double(), slm.double()  # float64: cached and uncached forwards agree, argmax never flips


def _records(tmp_path):
    lines = (tmp_path / "out" / "records.jsonl").read_text().splitlines()
    return {(r["id"], r["method"]): r for r in map(json.loads, lines)}


def test_baselines_end_to_end(tmp_path, bench_file, tokenizer, pair64):
    pytest.importorskip("matplotlib")
    llm, slm = pair64
    summary = evaluate(_cfg(tmp_path, bench_file, ["llm", "slm", "specdec"]), llm=llm, slm=slm, tokenizer=tokenizer)
    recs = _records(tmp_path)
    assert len(recs) == 9
    for pid in "abc":
        base, spec, small = recs[(pid, "llm")], recs[(pid, "specdec")], recs[(pid, "slm")]
        assert spec["output"] == base["output"]  # assisted generation == greedy LLM decoding
        assert 0 < base["new_tokens"] <= 12 and base["llm_tokens"] == base["new_tokens"] and base["slm_tokens"] == 0
        assert small["slm_tokens"] == small["new_tokens"] and small["llm_tokens"] == 0
        assert base["latency_s"] > 0 and base["prompt_tokens"] > 10
    stats = summary["results"]["toy"]
    assert stats["llm"]["speedup"] == 1.0 and stats["llm"]["n"] == 3
    assert summary["settings"]["max_new_tokens"] == 12 and summary["device"]
    out = tmp_path / "out"
    assert (out / "report.md").exists() and (out / "summary.json").exists() and (out / "tradeoff.png").exists()
    # a second call resumes: nothing re-runs, the records are unchanged
    evaluate(_cfg(tmp_path, bench_file, ["llm", "slm", "specdec"]), llm=llm, slm=slm, tokenizer=tokenizer)
    assert len((out / "records.jsonl").read_text().splitlines()) == 9


def test_resume_refuses_other_settings(tmp_path, bench_file, tokenizer, pair64):
    llm, slm = pair64
    evaluate(_cfg(tmp_path, bench_file, ["slm"], limit=1, plots=False), llm=llm, slm=slm, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="other settings.*max_new_tokens"):
        evaluate(EvalConfig(llm="tiny-llm", slm="tiny-slm", data=[str(bench_file)], methods=["slm"],
                            max_new_tokens=5, out=str(tmp_path / "out"), progress=False, plots=False),
                 llm=llm, slm=slm, tokenizer=tokenizer)
    summary = evaluate(EvalConfig(llm="tiny-llm", slm="tiny-slm", data=[str(bench_file)], methods=["slm"], limit=1,
                                  max_new_tokens=5, out=str(tmp_path / "out"), progress=False, plots=False,
                                  resume=False), llm=llm, slm=slm, tokenizer=tokenizer)
    assert summary["results"]["toy"]["slm"]["n"] == 1
    assert list((tmp_path / "out").glob("records.*.jsonl.bak"))


@pytest.mark.skipif(not STITCHING, reason="stitched decoding (hf_rstitch.stitched_decode) has not landed yet")
def test_stitched_methods_end_to_end(tmp_path, bench_file, tokenizer, pair64):
    llm, slm = pair64
    cfg = _cfg(tmp_path, bench_file, ["llm", "slm", "rstitch", "random"], thresholds=[0.0, 0.5, 1.0],
               random_p=[0.0, 1.0], plots=False, save_traces=True)
    summary = evaluate(cfg, llm=llm, slm=slm, tokenizer=tokenizer)
    recs = _records(tmp_path)
    for pid in "abc":
        base, small = recs[(pid, "llm")], recs[(pid, "slm")]
        for name, ref in (("rstitch@0", base), ("random@1", base), ("rstitch@1", small), ("random@0", small)):
            assert recs[(pid, name)]["output"] == ref["output"], (pid, name)
        assert recs[(pid, "rstitch@1")]["llm_tokens"] == 0
        assert recs[(pid, "rstitch@0")]["slm_tokens"] == 0
        mid = recs[(pid, "rstitch@0.5")]
        assert mid["llm_tokens"] + mid["slm_tokens"] == mid["new_tokens"]
        assert len(mid["trace"]["roles"]) == mid["new_tokens"]
    assert set(summary["results"]["toy"]) == {"llm", "slm", "rstitch@0", "rstitch@0.5", "rstitch@1",
                                              "random@0", "random@1"}


@pytest.mark.skipif(not STITCHING, reason="stitched decoding (hf_rstitch.stitched_decode) has not landed yet")
def test_router_hook_accepts_a_policy_object(tmp_path, bench_file, tokenizer, pair64):
    from hf_rstitch.core.policies import RandomPolicy

    llm, slm = pair64
    cfg = _cfg(tmp_path, bench_file, ["llm", "router"], router=RandomPolicy(1.0), plots=False, limit=1)
    evaluate(cfg, llm=llm, slm=slm, tokenizer=tokenizer)
    recs = _records(tmp_path)
    (router,) = [r for (pid, name), r in recs.items() if pid == "a" and name.startswith("router-")]  # names the policy
    assert router["output"] == recs[("a", "llm")]["output"]
    assert router["label"] == "R-Stitch+"


def test_checkpoint_stitch_default_does_not_leak_into_baselines(tmp_path, bench_file, tokenizer, pair64):
    llm, slm = pair64
    llm.generation_config.stitch_threshold = 0.5  # as a Hub template checkpoint might ship it
    try:
        evaluate(_cfg(tmp_path, bench_file, ["llm", "specdec"], plots=False, limit=1), llm=llm, slm=slm,
                 tokenizer=tokenizer)
    finally:
        llm.generation_config.stitch_threshold = None
    recs = _records(tmp_path)
    assert recs[("a", "specdec")]["output"] == recs[("a", "llm")]["output"]
    assert recs[("a", "specdec")]["counts"] == {}  # plain assisted generation: no stitch trace
