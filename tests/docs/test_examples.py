"""Every example script and notebook runs offline on the shipped pair, at the smallest sizes that
still exercise it (short budgets, two problems, one router step).

Scripts run in this process (``runpy``; they are ``main(argv)`` functions). Notebooks run headless
through nbclient with their ``parameters`` cell replaced by offline values, as papermill would,
so a notebook that breaks fails the build.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

import pytest

from hf_rstitch.toyworld.pair import assets_present

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
BENCHMARK = ROOT.parent / "shared" / "benchmarks" / "gsm8k.jsonl"  # one of the paper's six sets, when present

pytestmark = pytest.mark.skipif(not assets_present(), reason="the shipped pair is not in this checkout")


def run_example(name: str, argv: list[str], monkeypatch, tmp_path):
    """``python examples/<name> <argv>`` in this process; returns its ``main``'s result."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    module = runpy.run_path(str(EXAMPLES / name), run_name="example")
    return module["main"](argv)


def test_quickstart(monkeypatch, tmp_path, capsys):
    summary = run_example("quickstart.py", ["--max-new-tokens", "40"], monkeypatch, tmp_path)
    assert summary["new_tokens"] > 0 and summary["llm_tokens"] + summary["slm_tokens"] == summary["new_tokens"]
    assert "[" in capsys.readouterr().out  # some LLM tokens marked


def test_quickstart_hub_explains_itself_offline(monkeypatch, tmp_path, capsys):
    assert run_example("quickstart_hub.py", [], monkeypatch, tmp_path) == 0
    assert "skipped" in capsys.readouterr().out


@pytest.mark.slow  # 5.0 s on 2 cores (pytest --durations)
def test_threshold_sweep_writes_json_and_plot(monkeypatch, tmp_path):
    results = run_example("threshold_sweep.py", ["--n", "2", "--thresholds", "0.001", "1", "--max-new-tokens", "24",
                                                 "--out", "sweep"], monkeypatch, tmp_path)
    assert [r["threshold"] for r in results] == [0.001, 1.0]
    assert results[-1]["llm_token_share"] == 0.0  # tau = 1: the SLM alone
    assert json.loads((tmp_path / "sweep" / "sweep.json").read_text()) == results
    assert (tmp_path / "sweep" / "sweep.png").stat().st_size > 1000


@pytest.mark.slow  # 3.8 s on 2 cores (pytest --durations)
def test_train_router_small(monkeypatch, tmp_path):
    router = run_example("train_router.py", ["--steps", "1", "--batch-prompts", "1", "--group-size", "2",
                                             "--max-new-tokens", "16", "--out", "rr"], monkeypatch, tmp_path)
    assert (tmp_path / "rr" / "router" / "config.json").is_file()
    assert len((tmp_path / "rr" / "metrics.jsonl").read_text().splitlines()) == 1
    assert sum(p.numel() for p in router.parameters()) > 0


@pytest.mark.slow  # 8.5 s on 2 cores (pytest --durations)
def test_evaluate_benchmark(monkeypatch, tmp_path):
    data = BENCHMARK if BENCHMARK.is_file() else ROOT / "hf_rstitch" / "assets" / "pair" / "test.jsonl"
    summary = run_example("evaluate_benchmark.py", ["--data", str(data), "--limit", "2", "--max-new-tokens", "16",
                                                    "--out", "ev"], monkeypatch, tmp_path)
    assert "R-Stitch" in summary["table1_markdown"]
    assert len((tmp_path / "ev" / "records.jsonl").read_text().splitlines()) == 2 * 3  # problems x methods


OFFLINE = {  # parameters-cell values for CI: the shipped pair, tiny budgets
    "quickstart.ipynb": "USE_HUB_MODELS = False\nTHRESHOLD = 0.001\nMAX_NEW_TOKENS = 24\n"
                        "PROBLEM = 'Zoe has 61 stickers. Then Zoe finds 23 more. How many stickers does Zoe have now?'\n",
    "threshold_sweep.ipynb": "USE_HUB_MODELS = False\nTHRESHOLDS = [0.001, 1]\nN_PROBLEMS = 2\nMAX_NEW_TOKENS = 16\n",
    "router.ipynb": "USE_HUB_MODELS = False\nSTEPS = 1\nBATCH_PROMPTS = 1\nGROUP_SIZE = 2\nMAX_NEW_TOKENS = 16\n"
                    "OUT = 'runs/router-notebook'\n",
}


def test_every_notebook_is_covered_installs_as_the_readme_says_and_has_parameters():
    nbformat = pytest.importorskip("nbformat")
    assert {p.name for p in EXAMPLES.glob("*.ipynb")} == set(OFFLINE)
    for name in OFFLINE:
        nb = nbformat.read(EXAMPLES / name, as_version=4)
        install = next(c.source for c in nb.cells if c.cell_type == "code")
        assert "hf_rstitch-*.whl" in install and "%pip install" in install  # the wheel built from a clone
        assert "git+" not in install and "colab.research.google.com" not in nb.cells[0].source
        assert sum("parameters" in c.metadata.get("tags", []) for c in nb.cells) == 1
        assert all(c.cell_type != "code" or not c.outputs for c in nb.cells), f"{name}: commit notebooks without outputs"


@pytest.mark.slow  # 9-17 s per notebook (pytest --durations, 2-core CPU)
@pytest.mark.parametrize("name", sorted(OFFLINE))
def test_notebook_executes_offline(name, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    (params,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    params.source = OFFLINE[name]
    env = {"HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg", "PYTHONPATH": os.pathsep.join(sys.path)}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": str(tmp_path)}}).execute()
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    printed = [o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not any("IProgress" in text for text in printed), "tqdm found no ipywidgets (the notebook extra has it)"
