"""A newcomer's first hour, second pass (issue 47): bad input is one line at once, through the CLI as a user runs it.

A model or router that cannot load, offline (``HF_HUB_OFFLINE=1``) or with the Hub unreachable (``HF_ENDPOINT`` at a
closed local port: the same path as a machine without network, and nothing can be downloaded), and data that cannot
be read, fail before any model loads. "At once" is measured two ways that a busy machine does not blur: the
command's own seconds with torch imported before the clock starts, and which heavy modules it imported at all.
"""

from __future__ import annotations

import json

import pytest

from hf_rstitch.toyworld.pair import assets_present
from user_runs import one_line_error, run, run_probed

needs_pair = pytest.mark.skipif(not assets_present(), reason="the shipped pair is not in this checkout")
UNREACHABLE_HUB = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}  # connection refused at once
FAST_S = 5.0  # the command's own seconds, torch's import excluded


@pytest.mark.slow  # a fresh process that imports torch: > 3 s on 2 cores
@pytest.mark.parametrize("env", [{}, UNREACHABLE_HUB], ids=["offline", "hub-unreachable"])
def test_serve_names_the_flag_and_model_that_cannot_load_at_once(env):  # item 3
    done, seconds, heavy = run_probed("serve", "--llm", "nobody/x", "--slm", "nobody/y", env=env, preload_torch=True)
    one_line_error(done, "--llm nobody/x")
    assert done.returncode == 2 and seconds < FAST_S and "transformers" not in heavy, (seconds, heavy)


@pytest.mark.slow  # a fresh process that imports torch: > 3 s on 2 cores
@needs_pair
@pytest.mark.parametrize("argv", [
    ["serve", "--router", "nobody/router"],
    ["tune", "--llm", "shipped:llm", "--slm", "shipped:slm", "--max-drop", "1", "--n", "2", "--router", "nobody/router"],
], ids=["serve", "tune"])
def test_a_router_that_cannot_load_is_named_at_once(argv):  # item 4
    done, seconds, heavy = run_probed(*argv, preload_torch=True)
    one_line_error(done, "--router nobody/router", "HF_HUB_OFFLINE")
    assert seconds < FAST_S and "transformers" not in heavy, (seconds, heavy)
    assert "0/" not in done.stderr  # no progress bar started


def test_generate_names_stitch_router_that_cannot_load(monkeypatch):  # item 4, the Python API
    import time

    import torch

    import hf_rstitch  # noqa: F401
    from tiny_models import make_pair, prompt

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    llm, slm = make_pair("llama")
    ids = prompt()
    start = time.perf_counter()
    with pytest.raises(OSError, match="stitch_router nobody/no-router"):
        llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=slm, stitch_router="nobody/no-router",
                     max_new_tokens=2)
    assert time.perf_counter() - start < FAST_S


def test_eval_reads_a_bad_local_json_file_as_a_file(tmp_path):  # item 6
    bad = tmp_path / "bad.json"
    bad.write_text('[\n  {"id": "a", "problem": "What is 2 + 3?", "answer": "5"},\n  {"id": "b", "problem": \n]\n')
    done = run("eval", "--data", str(bad), "--out", str(tmp_path / "out"))
    line = one_line_error(done, f"{bad}:4", "not valid JSON")
    assert "Hub" not in line and "load_dataset" not in line


def test_eval_reads_a_json_array_and_json_lines_alike(tmp_path):
    from hf_rstitch.eval.data import load_problems

    rows = [{"id": "a", "problem": "What is 2 + 3?", "answer": "5"}, {"id": "b", "problem": "1 + 1?", "answer": "2"}]
    (tmp_path / "array.json").write_text(json.dumps(rows))
    (tmp_path / "wrapped.json").write_text(json.dumps({"data": rows}))
    (tmp_path / "lines.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = {name: load_problems(str(tmp_path / f"{name}.json")) for name in ("array", "wrapped", "lines")}
    fields = {name: [(p.id, p.problem, p.answer) for p in problems] for name, problems in got.items()}
    assert [f[0] for f in fields["array"]] == ["a", "b"] and fields["array"] == fields["wrapped"] == fields["lines"]


@needs_pair
@pytest.mark.parametrize("command", [
    ["eval", "--out", "OUT"],
    ["tune", "--llm", "shipped:llm", "--slm", "shipped:slm", "--max-drop", "1"],
    ["train-router", "--steps", "1", "--out", "OUT"],
])
@pytest.mark.parametrize("flaw", ["duplicate id", "missing key"])
def test_data_errors_come_before_torch_loads(tmp_path, command, flaw):  # item 11
    rows = ([{"id": "a", "problem": "What is 2 + 3?", "answer": "5"}] * 2 if flaw == "duplicate id"
            else [{"id": "a", "problem": "What is 2 + 3?"}])
    data = tmp_path / "dev.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in command]
    done, _, heavy = run_probed(*argv, "--data", str(data), env={"OMP_NUM_THREADS": None})  # the threads rule too
    one_line_error(done, f"{data}:", flaw.split()[0])
    assert heavy == [], heavy  # neither torch nor transformers imported: no model could have loaded


@pytest.mark.slow  # the example imports torch in a fresh process: > 3 s on 2 cores
def test_hub_example_says_in_one_line_that_the_hub_cannot_be_reached():  # item 10
    done = run(script="examples/quickstart_hub.py", env=UNREACHABLE_HUB)
    one_line_error(done, "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "cannot reach the Hugging Face Hub")
