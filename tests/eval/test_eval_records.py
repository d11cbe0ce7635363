"""Records, resume after an interruption, and re-tabulation from records alone."""

from __future__ import annotations

import json

import pytest

from hf_rstitch.eval import EvalConfig, evaluate
from hf_rstitch.eval.data import load_jsonl
from hf_rstitch.eval.methods import Method
from hf_rstitch.eval.report import aggregate, table1_markdown, token_table_markdown, write_report
from hf_rstitch.eval.runner import RecordStore, run_eval


class FakeMethod(Method):
    """Answers every problem with a canned completion; raises after ``stop_after`` timed calls."""

    def __init__(self, kind, tokenizer, log, param=None, answer="2", stop_after=None):
        super().__init__(None, None, None)
        self.kind, self.param, self.label_text = kind, param, kind.upper()
        self.tokenizer, self.log, self.answer, self.stop_after = tokenizer, log, answer, stop_after

    def run(self, input_ids, max_new_tokens=None):
        if max_new_tokens is None:  # timed call (warm-up calls pass a small budget)
            if self.stop_after is not None and len(self.log) >= self.stop_after:
                raise KeyboardInterrupt
            self.log.append((self.name, input_ids.shape[1]))
        ids = self.tokenizer(f"so \\boxed{{{self.answer}}}")["input_ids"] + [self.tokenizer.eos_token_id]
        return ids, {"new_tokens": len(ids), "llm_tokens": len(ids), "slm_tokens": 0, "switches": 0}


def _methods(tokenizer, log, stop_after=None):
    return [FakeMethod("llm", tokenizer, log, stop_after=stop_after),
            FakeMethod("rstitch", tokenizer, log, param=0.02, answer="5", stop_after=stop_after)]


def test_interrupted_run_resumes_without_redoing(tmp_path, tokenizer, bench_file):
    problems = load_jsonl(bench_file)
    store = RecordStore(tmp_path / "records.jsonl")
    log: list = []
    with pytest.raises(KeyboardInterrupt):
        run_eval(_methods(tokenizer, log, stop_after=4), problems, tokenizer, store, progress=False)
    first = store.load()
    assert len(first) == 4 and len(log) == 4
    # problems are the outer loop: the first two problems are complete for both methods
    assert [(r["id"], r["method"]) for r in first] == [("a", "llm"), ("a", "rstitch@0.02"),
                                                       ("b", "llm"), ("b", "rstitch@0.02")]
    log2: list = []
    new = run_eval(_methods(tokenizer, log2), problems, tokenizer, store, progress=False)
    assert [(r["id"], r["method"]) for r in new] == [("c", "llm"), ("c", "rstitch@0.02")]
    assert [name for name, _ in log2] == ["llm", "rstitch@0.02"]
    records = store.load()
    assert len(records) == 6 and len({(r["id"], r["method"]) for r in records}) == 6
    # nothing left: a third run does no work at all
    assert run_eval(_methods(tokenizer, []), problems, tokenizer, store, progress=False) == []


def test_record_contents(tmp_path, tokenizer, bench_file):
    store = RecordStore(tmp_path / "records.jsonl")
    run_eval(_methods(tokenizer, []), load_jsonl(bench_file), tokenizer, store, progress=False, max_new_tokens=64)
    by = {(r["id"], r["method"]): r for r in store.load()}
    r = by[("a", "llm")]
    assert r["correct"] is True and r["extracted"] == "2" and r["extracted_by"] == "boxed"
    assert r["output"] == "so \\boxed{2}" and r["hit_eos"] is False  # fake models have no generation_config
    assert r["latency_s"] >= 0 and r["new_tokens"] == r["llm_tokens"] > 0 and r["dataset"] == "toy"
    assert by[("b", "rstitch@0.02")]["correct"] is True and by[("a", "rstitch@0.02")]["correct"] is False
    assert by[("b", "rstitch@0.02")]["param"] == 0.02 and by[("b", "rstitch@0.02")]["kind"] == "rstitch"


def test_torn_last_line_is_dropped_and_repaired(tmp_path):
    store = RecordStore(tmp_path / "records.jsonl")
    rec = {"dataset": "d", "id": "1", "method": "llm"}
    store.append(rec)
    with store.path.open("a") as fh:
        fh.write('{"dataset": "d", "id": "2", "meth')  # killed mid-write
    assert store.load() == [rec]
    store.append({**rec, "id": "3"})
    assert [r["id"] for r in store.load()] == ["1", "3"]
    store.path.write_text('{"bad\n' + json.dumps(rec) + "\n")
    with pytest.raises(ValueError, match="records.jsonl:1: corrupt record"):
        store.load()


def _rec(ds, pid, method, kind, param, correct, latency, llm_tok, slm_tok, switches=0):
    return {"dataset": ds, "id": pid, "method": method, "kind": kind, "param": param, "label": kind,
            "answer": "1", "output": "\\boxed{1}" if correct else "\\boxed{0}", "correct": correct,
            "latency_s": latency, "new_tokens": llm_tok + slm_tok, "llm_tokens": llm_tok,
            "slm_tokens": slm_tok, "switches": switches, "truncated": False}


RECORDS = [
    _rec("aime24", "1", "llm", "llm", None, True, 10.0, 100, 0),
    _rec("aime24", "2", "llm", "llm", None, False, 30.0, 300, 0),
    _rec("aime24", "1", "rstitch@0.02", "rstitch", 0.02, True, 4.0, 20, 60, 6),
    _rec("aime24", "2", "rstitch@0.02", "rstitch", 0.02, True, 6.0, 40, 80, 10),
    _rec("aime24", "1", "slm", "slm", None, False, 1.0, 0, 50),
    _rec("aime24", "2", "slm", "slm", None, False, 3.0, 0, 70),
    _rec("aime24", "3", "llm", "llm", None, True, 99.0, 999, 0),  # only LLM finished id 3: left out
]


def test_aggregate_by_hand():
    agg = aggregate(RECORDS)["aime24"]
    assert list(agg) == ["slm", "llm", "rstitch@0.02"]
    llm, rs = agg["llm"], agg["rstitch@0.02"]
    assert llm["n"] == 2 and llm["n_done"] == 3
    assert llm["acc"] == 50.0 and llm["latency_s"] == 20.0 and llm["speedup"] == 1.0
    assert rs["acc"] == 100.0 and rs["latency_s"] == 5.0 and rs["speedup"] == 4.0
    assert rs["llm_tokens"] == 30 and rs["slm_tokens"] == 70 and rs["total_tokens"] == 100
    assert rs["token_reduction_pct"] == pytest.approx(50.0) and rs["switches"] == 8
    table = table1_markdown(aggregate(RECORDS))
    assert "| rstitch | 0.02 | 100.00 | 5.00 | 4.00× |" in table
    tokens = token_table_markdown(agg, "aime24")
    assert "| rstitch | 0.02 | 100.00 | 5.00 | 4.00× | 30.00 | 70.00 | 100.00 | +50.00% | 8.00 |" in tokens


@pytest.mark.slow  # 6.2 s on 2 cores (pytest --durations)
def test_report_only_retabulates_from_records(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "run"
    out.mkdir()
    (out / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    (out / "run.json").write_text(json.dumps({"device": "test-cpu", "settings": {"llm": "L", "slm": "S",
                                                                                  "max_new_tokens": 8192}}))
    summary = evaluate(EvalConfig(report_only=True, out=str(out), regrade=True))
    assert summary["device"] == "test-cpu"
    assert summary["results"]["aime24"]["rstitch@0.02"]["speedup"] == 4.0
    assert (out / "report.md").read_text().count("| rstitch | 0.02 |") == 2
    saved = json.loads((out / "summary.json").read_text())
    assert saved["settings"]["max_new_tokens"] == 8192 and "report_date" in saved
    assert (out / "tradeoff.png").stat().st_size > 0
    assert (out / "per_sample" / "aime24__rstitch@0.02.png").stat().st_size > 0


def test_write_report_refuses_empty(tmp_path):
    with pytest.raises(ValueError, match="no records"):
        write_report(tmp_path, [], {}, plots=False)
