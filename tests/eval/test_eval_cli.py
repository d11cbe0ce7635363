"""``rstitch eval`` options come from EvalConfig; bad input is rejected with a clear message."""

from __future__ import annotations

import json

import pytest

from hf_rstitch.cli.main import build_parser, main
from hf_rstitch.cli.args import dataclass_from_args
from hf_rstitch.eval.config import METHOD_KINDS, EvalConfig
from hf_rstitch.eval.methods import METHODS


def _cfg(argv):
    return dataclass_from_args(EvalConfig, build_parser().parse_args(["eval", *argv]))


def test_flags_map_to_config():
    cfg = _cfg(["--llm", "L", "--slm", "S", "--data", "a.jsonl", "b.jsonl", "--methods", "llm", "rstitch",
                "--thresholds", "0.01", "0.05", "--random-p", "0.3", "--max-new-tokens", "16384", "--do-sample",
                "--limit", "5", "--out", "o", "--device", "cpu", "--dtype", "float32", "--no-resume"])
    assert cfg.data == ["a.jsonl", "b.jsonl"] and cfg.methods == ["llm", "rstitch"]
    assert cfg.thresholds == [0.01, 0.05] and cfg.random_p == [0.3] and cfg.max_new_tokens == 16384
    assert cfg.do_sample and cfg.limit == 5 and not cfg.resume and cfg.dtype == "float32"


def test_defaults_follow_the_paper():
    cfg = _cfg(["--llm", "L", "--slm", "S", "--data", "a.jsonl"])
    assert cfg.max_new_tokens == 8192 and not cfg.do_sample and cfg.resume
    assert cfg.thresholds == [0.001, 0.02, 0.03] and "\\boxed{}" in cfg.instruction


def test_method_names_match_registry():
    assert set(METHOD_KINDS) == set(METHODS)


@pytest.mark.parametrize("kw,match", [
    ({"slm": ""}, "pass both --llm and --slm"),  # or neither: the shipped pair
    ({"data": []}, "--data is required"),
    ({"thresholds": [1.5]}, r"--thresholds values must be in \[0, 1\]"),
    ({"methods": ["rstitch"], "thresholds": []}, "needs at least one --thresholds"),
    ({"methods": ["router"]}, "needs a router: --router-path"),
    ({"max_new_tokens": 0}, "--max-new-tokens must be positive"),
    ({"limit": 0}, "--limit must be positive"),
])
def test_validation(kw, match):
    base = {"llm": "L", "slm": "S", "data": ["a.jsonl"]}
    with pytest.raises(ValueError, match=match):
        EvalConfig(**{**base, **kw})


def test_cli_error_is_a_message_not_a_traceback(capsys):
    assert main(["eval", "--llm", "L", "--slm", "S"]) == 2
    assert "--data is required" in capsys.readouterr().err


def test_cli_report_only(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    rec = {"dataset": "toy", "id": "1", "method": "llm", "kind": "llm", "param": None, "label": "LLM",
           "answer": "1", "output": "\\boxed{1}", "correct": True, "latency_s": 2.0, "new_tokens": 10,
           "llm_tokens": 10, "slm_tokens": 0, "switches": 0}
    (out / "records.jsonl").write_text(json.dumps(rec) + "\n")
    assert main(["eval", "--report-only", "--out", str(out), "--no-plots"]) == 0
    printed = capsys.readouterr().out
    assert "| LLM | -- | 100.00 | 2.00 | 1.00× |" in printed
    assert json.loads(printed.strip().splitlines()[-1])["results"]["toy"]["llm"]["acc"] == 100.0


def test_cli_loads_checkpoints_from_disk(tmp_path, tokenizer, pair, bench_file, capsys):
    llm, slm = pair
    for name, model in (("llm", llm), ("slm", slm)):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    out = tmp_path / "out"
    argv = ["eval", "--llm", str(tmp_path / "llm"), "--slm", str(tmp_path / "slm"), "--data", str(bench_file),
            "--methods", "llm", "rstitch", "--thresholds", "0.5", "--max-new-tokens", "6", "--limit", "2",
            "--out", str(out), "--device", "cpu", "--no-plots", "--no-progress"]
    assert main(argv) == 0
    lines = (out / "records.jsonl").read_text().splitlines()
    assert len(lines) == 4
    assert "R-Stitch" in (out / "report.md").read_text() or "rstitch" in (out / "report.md").read_text()
    assert json.loads((out / "run.json").read_text())["settings"]["max_new_tokens"] == 6


def test_no_models_named_is_the_shipped_pair_as_in_the_other_commands():
    from hf_rstitch import shipped

    cfg = EvalConfig(data=["a.jsonl"])
    assert (cfg.llm, cfg.slm) == (str(shipped("llm")), str(shipped("slm"))) and cfg.instruction == ""
