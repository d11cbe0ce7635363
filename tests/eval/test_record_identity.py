"""Record identity and output-folder safety: a record's key names everything that changes the
method's output (router weights, exact thresholds), one run at a time per --out, and paths made
from records never leave --out."""

from __future__ import annotations

import json
import os

import pytest
import torch

from hf_rstitch.eval import EvalConfig, evaluate
from hf_rstitch.eval.methods import GenSettings, LearnedRouter, RStitch, build_methods
from hf_rstitch.eval.report import write_report
from hf_rstitch.router import Router


def _router(seed: int, threshold: float = 0.001) -> Router:
    torch.manual_seed(seed)
    return Router(32, width=8, num_blocks=1, threshold=threshold)


def test_threshold_keys_are_exact_and_unchanged_where_g_is_exact():
    s = GenSettings()
    assert RStitch(None, None, s, 0.02).name == "rstitch@0.02"
    assert RStitch(None, None, s, 1e-05).name == "rstitch@1e-05"
    assert RStitch(None, None, s, 0.001).name != RStitch(None, None, s, 0.001000001).name


def test_router_key_names_weights_and_threshold():
    s = GenSettings()
    a, a_again, b = _router(0), _router(0), _router(1)
    names = {LearnedRouter(None, None, s, a).name, LearnedRouter(None, None, s, b).name,
             LearnedRouter(None, None, s, a, threshold=0.5).name}
    assert len(names) == 3
    assert LearnedRouter(None, None, s, a).name == LearnedRouter(None, None, s, a_again).name
    assert LearnedRouter(None, None, s, a).name.endswith("@0.001")  # the router's own threshold


def test_router_folder_is_identified_by_its_weights(tmp_path):
    _router(0).save_pretrained(tmp_path / "r")
    s = GenSettings()
    assert LearnedRouter(None, None, s, str(tmp_path / "r")).name == LearnedRouter(None, None, s, _router(0)).name


def test_another_router_on_the_same_out_gets_its_own_records(tmp_path, bench_file, tokenizer, pair):
    llm, slm = pair
    common = dict(llm="tiny-llm", slm="tiny-slm", data=[str(bench_file)], methods=["router"], max_new_tokens=4,
                  out=str(tmp_path / "out"), progress=False, plots=False, limit=1, warmup=False)
    evaluate(EvalConfig(router=_router(0), **common), llm=llm, slm=slm, tokenizer=tokenizer)
    evaluate(EvalConfig(router=_router(1), **common), llm=llm, slm=slm, tokenizer=tokenizer)
    evaluate(EvalConfig(router=_router(1), router_threshold=0.5, **common), llm=llm, slm=slm, tokenizer=tokenizer)
    lines = (tmp_path / "out" / "records.jsonl").read_text().splitlines()
    assert len({json.loads(x)["method"] for x in lines}) == 3 and len(lines) == 3


def test_duplicate_methods_are_refused_before_any_record():
    with pytest.raises(ValueError, match=r"--thresholds lists \[0.02\] more than once"):
        EvalConfig(llm="a", slm="b", data=["x.jsonl"], thresholds=[0.02, 0.01, 0.02])
    from hf_rstitch.eval.runner import RecordStore, run_eval

    methods = build_methods(["rstitch"], None, None, GenSettings(), thresholds=[0.02, 0.02])
    with pytest.raises(ValueError, match="more than once"):
        run_eval(methods, [], None, RecordStore("unused.jsonl"))


@pytest.mark.skipif(os.name == "nt", reason="the test holds the lock with fcntl")
def test_a_second_run_on_a_busy_out_is_refused(tmp_path, bench_file, tokenizer, pair):
    import fcntl

    llm, slm = pair
    out = tmp_path / "out"
    out.mkdir()
    with open(out / ".lock", "a+") as held:  # what a running `rstitch eval --out out` holds
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        cfg = EvalConfig(llm="tiny-llm", slm="tiny-slm", data=[str(bench_file)], methods=["llm"], max_new_tokens=4,
                         out=str(out), progress=False, plots=False, limit=1, warmup=False)
        with pytest.raises(ValueError, match="in use by another run"):
            evaluate(cfg, llm=llm, slm=slm, tokenizer=tokenizer)
        assert not (out / "records.jsonl").exists()
    evaluate(cfg, llm=llm, slm=slm, tokenizer=tokenizer)  # released: runs
    assert len((out / "records.jsonl").read_text().splitlines()) == 1


def _rec(dataset, method, kind, param, latency):
    return {"dataset": dataset, "id": "1", "method": method, "kind": kind, "param": param, "label": kind,
            "answer": "1", "correct": True, "latency_s": latency, "new_tokens": 4, "llm_tokens": 4, "slm_tokens": 0,
            "switches": 0, "output": "\\boxed{1}", "truncated": False}


def test_report_paths_from_records_stay_inside_out(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "a" / "b" / "out"
    records = [_rec("../../../escape", "llm", "llm", None, 2.0),
               _rec("../../../escape", "rstitch@0.02", "rstitch", 0.02, 1.0),
               _rec("owner/name", "llm", "llm", None, 2.0), _rec("owner/name", "rstitch@0.02", "rstitch", 0.02, 1.0)]
    summary = write_report(out, records, {}, plots=True)
    outside = [p for p in tmp_path.rglob("*") if p.is_file() and out not in p.parents]
    assert outside == []
    for plot in summary["plots"]:
        assert (out / plot).resolve().parent in (out.resolve(), (out / "per_sample").resolve())
