"""``rstitch eval --batch-size N``: continuous batching gives every problem the record it gets alone."""

from __future__ import annotations

import json
import logging

import pytest

from hf_rstitch.eval import EvalConfig, evaluate

KEYS = ("output", "correct", "new_tokens", "llm_tokens", "slm_tokens", "switches")


@pytest.fixture(scope="module")
def pair64(pair):
    llm, slm = pair
    return llm.double(), slm.double()


def _run(tmp_path, name, bench_file, tokenizer, pair64, batch_size, **kw):
    llm, slm = pair64
    cfg = EvalConfig(llm="tiny-llm", slm="tiny-slm", data=[str(bench_file)], max_new_tokens=12, out=str(tmp_path / name),
                     progress=False, plots=False, batch_size=batch_size, **kw)
    evaluate(cfg, llm=llm, slm=slm, tokenizer=tokenizer)
    lines = (tmp_path / name / "records.jsonl").read_text().splitlines()
    return {(r["id"], r["method"]): r for r in map(json.loads, lines)}


def test_batched_records_equal_batch_size_one(tmp_path, bench_file, tokenizer, pair64):
    methods = dict(methods=["llm", "slm", "specdec", "rstitch"], thresholds=[0.0, 0.5, 1.0])
    one = _run(tmp_path, "b1", bench_file, tokenizer, pair64, 1, **methods)
    two = _run(tmp_path, "b2", bench_file, tokenizer, pair64, 2, **methods)
    assert one.keys() == two.keys() and len(one) == 3 * 6
    for k, rec in one.items():
        assert {f: two[k][f] for f in KEYS} == {f: rec[f] for f in KEYS}, k
        assert two[k].get("batch_size", 1) == (1 if k[1] == "specdec" else 2)  # assisted generation: B = 1 only
        assert two[k]["latency_s"] > 0
    # resuming a batched run re-runs nothing
    again = _run(tmp_path, "b2", bench_file, tokenizer, pair64, 2, **methods)
    assert again == two


def test_batch_size_is_validated_and_defaults_by_device():
    with pytest.raises(ValueError, match="--batch-size must be a positive integer"):
        EvalConfig(llm="a", slm="b", data=["x.jsonl"], batch_size=0)
    cfg = EvalConfig(llm="a", slm="b", data=["x.jsonl"])
    assert cfg.batch_size_on("cpu") == 1 and cfg.batch_size_on("cuda:0") == 16


def test_waiting_for_the_llm_changes_no_record(tmp_path, bench_file, tokenizer, pair64):
    methods = dict(methods=["rstitch"], thresholds=[0.3, 0.5])
    now = _run(tmp_path, "now", bench_file, tokenizer, pair64, 3, **methods)
    gather = _run(tmp_path, "gather", bench_file, tokenizer, pair64, 3, schedule="gather:2:2", **methods)
    assert now.keys() == gather.keys()
    for k, rec in now.items():
        assert {f: gather[k][f] for f in KEYS} == {f: rec[f] for f in KEYS}, k
    run = json.loads((tmp_path / "gather" / "run.json").read_text())
    assert run["schedule"] == "gather:2:2"
    with pytest.raises(ValueError, match="--schedule: schedule 'soon'"):
        EvalConfig(llm="a", slm="b", data=["x.jsonl"], schedule="soon")


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_the_fast_engine_gives_the_same_records(tmp_path, bench_file, tokenizer, pair64, monkeypatch):
    methods = dict(methods=["llm", "slm", "rstitch"], thresholds=[0.5])
    eager = _run(tmp_path, "eager", bench_file, tokenizer, pair64, 2, engine="default", **methods)
    with pytest.warns(UserWarning, match="runs its static-cache steps eagerly"):  # CPU: no graphs, same outputs
        fast = _run(tmp_path, "fast", bench_file, tokenizer, pair64, 2, engine="fast", **methods)
    with pytest.warns(UserWarning, match="runs its static-cache steps eagerly"):
        one = _run(tmp_path, "fast1", bench_file, tokenizer, pair64, 1, engine="fast", **methods)
    monkeypatch.setattr("hf_rstitch.engine.engine._SAID", set())  # earlier runs may have said it (INFO once)
    logger = logging.getLogger("hf_rstitch.fast")  # its own handler: other tests may stop propagation
    seen = _Lines()
    logger.addHandler(seen)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        auto = _run(tmp_path, "auto", bench_file, tokenizer, pair64, 2, engine="auto", **methods)
    finally:
        logger.removeHandler(seen)
        logger.setLevel(level)
    assert any("runs the eager engine" in m and "need CUDA" in m for m in seen.lines)
    for got in (fast, one, auto):
        assert got.keys() == eager.keys()
        for k, rec in eager.items():
            assert {f: got[k][f] for f in KEYS} == {f: rec[f] for f in KEYS}, k
    assert json.loads((tmp_path / "fast1" / "run.json").read_text())["engine"] == "fast"
    with pytest.raises(ValueError, match="--engine must be default, fast or auto"):
        EvalConfig(llm="a", slm="b", data=["x.jsonl"], engine="turbo")


def test_no_engine_named_on_cpu_keeps_the_batch_size_one_harness(tmp_path, bench_file, tokenizer, pair64, monkeypatch):
    """auto off CUDA is the eager engine: at batch size 1 the problems go through ``generate`` one by one
    (per-sample latency, no ``batch_size`` in the records), as with --engine default."""
    monkeypatch.delenv("HF_RSTITCH_ENGINE", raising=False)
    methods = dict(methods=["llm", "rstitch"], thresholds=[0.5])
    unnamed = _run(tmp_path, "unnamed", bench_file, tokenizer, pair64, 1, **methods)
    eager = _run(tmp_path, "eager", bench_file, tokenizer, pair64, 1, engine="default", **methods)
    assert unnamed.keys() == eager.keys() and len(unnamed) == 2 * 3
    for k, rec in eager.items():
        assert {f: unnamed[k][f] for f in KEYS} == {f: rec[f] for f in KEYS}, k
        assert "batch_size" not in unnamed[k] and "batch_size" not in rec
    assert json.loads((tmp_path / "unnamed" / "run.json").read_text())["engine"] == "default"  # what ran
