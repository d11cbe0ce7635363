"""``rstitch toyworld eval``: one model alone, optionally made to answer in a given style."""

import json

import pytest

from hf_rstitch.cli.main import main
from hf_rstitch.toyworld.pair import assets_present


@pytest.mark.skipif(not assets_present(), reason="shipped pair not present")
def test_eval_opened_in_the_concise_style(tmp_path, capsys):
    out = tmp_path / "ev.json"
    assert main(["toyworld", "eval", "--n", "3", "--opener", "So", "--json-out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["opener"] == "So" and report["n"] == 3
    # opened with "So", the shipped LLM continues concisely: ": a op b = c. ..." instead of its steps
    assert all(r["text"].startswith(":") and "Step 1" not in r["text"] for r in report["results"])
    assert report["accuracy"] == 1.0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["opener"] == "So"
