"""A newcomer's first commands, second pass (issue 47): what the defaults show and say, through the CLI as a user
runs it (``python -m hf_rstitch``, offline)."""

from __future__ import annotations

import ast
import json
import re

import pytest

from hf_rstitch.toyworld.pair import assets_present
from user_runs import run

needs_pair = pytest.mark.skipif(not assets_present(), reason="the shipped pair is not in this checkout")


def test_generate_asks_the_shipped_pair_its_own_kind_of_question():
    from hf_rstitch.cli.generate import GenerateConfig
    from hf_rstitch.toyworld.tasks import example_row, split_of, program_of

    row = example_row()
    assert GenerateConfig().prompt == row["problem"] and split_of(program_of(row)) == "test"


@pytest.mark.slow  # loads and runs the pair in a fresh process: ~10 s on 2 cores
@needs_pair
def test_generate_with_every_default_answers_its_prompt_right_stitched():
    from hf_rstitch.toyworld.tasks import example_row

    done = run("generate")
    assert done.returncode == 0, done.stderr
    assert f"\\boxed{{{example_row()['answer']}}}" in done.stdout, done.stdout
    summary = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert summary["llm_tokens"] > 0 and summary["slm_tokens"] > 0, summary  # both models wrote: stitched


@pytest.mark.parametrize("command", ["generate", "serve", "eval", "tune", "demo", "export-hub-template"])
def test_help_shows_no_empty_or_doubled_default(command):
    """Each option's help says its default at most once, and never an empty one."""
    entries = re.split(r"\n  (?=-)", run(command, "--help").stdout.split("options:", 1)[1])
    for entry in (" ".join(e.split()) for e in entries):
        assert "(default: )" not in entry and "(default: None)" not in entry, entry
        assert entry.count("(default:") + entry.count("; default:") <= 1, entry


def test_one_default_threshold_for_generate_serve_and_the_docs():
    """One home (hf.settings): the CLI defaults read it, and the README and Getting started use it."""
    from hf_rstitch.cli.generate import GenerateConfig
    from hf_rstitch.hf.settings import DEFAULT_THRESHOLD, default_threshold
    from hf_rstitch.serve.config import ServeConfig
    from user_runs import ROOT

    assert GenerateConfig().threshold is None and ServeConfig().threshold is None
    assert default_threshold() == DEFAULT_THRESHOLD

    class Tuned:
        stitch_threshold = 0.005

    assert default_threshold(Tuned()) == 0.005 and default_threshold(Tuned(), 0.1) == 0.1
    for page in ("README.md", "docs/index.md", "docs/serving.md"):
        text = (ROOT / page).read_text()
        taus = {float(t) for t in re.findall(r"stitch_threshold=([0-9.]+)", text)}
        assert taus <= {DEFAULT_THRESHOLD}, (page, taus)


@needs_pair
def test_export_hint_names_the_threshold_given(tmp_path):
    done = run("export-hub-template", str(tmp_path / "repo"), "--threshold", "0.005")
    assert done.returncode == 0, done.stderr
    assert "stitch_threshold=0.005" in done.stdout + done.stderr and "stitch_threshold=0.02" not in done.stdout


@needs_pair
@pytest.mark.slow  # eval in a fresh process on the shipped pair: ~15 s on 2 cores
def test_eval_defaults_to_the_shipped_pair_and_reports_it_plainly(tmp_path):
    """No --llm (as generate, serve, demo); the report names `shipped:llm`, not a path into this install;
    transformers' assisted generation (SpecDec) adds no deprecation warning of its own call; a reduction of
    tokens reads as a positive reduction."""
    from hf_rstitch.toyworld.tasks import make_split

    data = tmp_path / "two.jsonl"
    data.write_text("".join(json.dumps({"id": r["id"], "problem": r["problem"], "answer": r["answer"]}) + "\n"
                            for r in make_split("test", 2, seed=3)))
    done = run("eval", "--data", str(data), "--methods", "llm", "specdec", "rstitch", "--thresholds", "0.02",
               "--max-new-tokens", "300", "--out", str(tmp_path / "out"), "--no-plots", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "Passing `generation_config`" not in done.stderr, done.stderr
    report = (tmp_path / "out" / "report.md").read_text()
    assert "LLM `shipped:llm`, SLM `shipped:slm`" in report and "site-packages" not in report, report[:400]
    run_meta = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run_meta["models"]["llm"]["name"] == "shipped:llm"
    stitched = json.loads(done.stdout.strip().splitlines()[-1])["results"]["two"]["rstitch@0.02"]
    assert stitched["token_reduction_pct"] > 0 and f"+{stitched['token_reduction_pct']:.2f}%" in report


def test_budgets_read_in_points_with_the_right_number():
    from hf_rstitch.eval.choose import SweepPoint, choose

    points = [SweepPoint(0.01, 99.5, 0.1, 40, None, "rstitch")]
    assert "within 1 point of" in choose(points, 100.0, max_drop=1).reason
    assert "within 2 points of" in choose(points, 100.0, max_drop=2).reason


def test_serve_says_nothing_of_a_kv_pool_where_eager_lanes_run(caplog):
    import logging

    from hf_rstitch.serve.config import ServeConfig, kv_plan
    from tiny_models import make_pair

    llm, slm = make_pair("llama")
    with caplog.at_level(logging.INFO, logger="hf_rstitch"):
        kv_plan(ServeConfig(engine="auto"), llm, slm)
    assert "KV memory" not in caplog.text
