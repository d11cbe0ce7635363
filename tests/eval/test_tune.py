"""``rstitch tune``: the choice rule on hand-made points, and the command end to end on the shipped pair."""

from __future__ import annotations

import json

import pytest

from hf_rstitch.cli.main import main
from hf_rstitch.eval.choose import SweepPoint, choose, table
from hf_rstitch.eval.batched import llm_alone_ms
from hf_rstitch.eval.methods import GenSettings, LLMOnly
from hf_rstitch.toyworld.pair import assets_present

ALONE = SweepPoint(0.0, 90.0, 1.0, 200.0, 1.0, "llm")
POINTS = [ALONE,
          SweepPoint(0.001, 89.5, 0.30, 60.0, 4.0),
          SweepPoint(0.01, 89.0, 0.10, 45.0, 6.0),
          SweepPoint(0.05, 85.0, 0.05, 44.0, 7.0)]


def test_accuracy_budget_takes_the_fastest_point_inside_it():
    assert choose(POINTS, 90.0, max_drop=1.0).point.threshold == 0.01  # 89.0 >= 89.0, 6x beats 4x
    assert choose(POINTS, 90.0, max_drop=0.5).point.threshold == 0.001
    assert choose(POINTS, 90.0, max_drop=0.0).point.threshold == 0.0  # only the LLM alone qualifies


def test_speed_target_takes_the_most_accurate_fast_enough_point():
    assert choose(POINTS, 90.0, target_speedup=5.0).point.threshold == 0.01
    assert choose(POINTS, 90.0, target_speedup=6.5).point.threshold == 0.05
    both = choose(POINTS, 90.0, max_drop=1.0, target_speedup=6.5)
    assert both.point is None and "accuracy >= 89.00 %" in both.reason and "speed-up >= 6.5x" in both.reason


def test_without_latency_the_llm_share_decides():
    shares = [SweepPoint(p.threshold, p.accuracy, p.llm_share, p.mean_tokens) for p in POINTS]
    assert choose(shares, 90.0, max_drop=1.0).point.threshold == 0.01
    with pytest.raises(ValueError, match="--latency"):
        choose(shares, 90.0, target_speedup=2.0)


def test_budgets_are_validated():
    with pytest.raises(ValueError, match="--max-drop POINTS"):
        choose(POINTS, 90.0)
    with pytest.raises(ValueError, match=">= 0"):
        choose(POINTS, 90.0, max_drop=-1)


def test_table_marks_the_choice():
    text = table(POINTS, POINTS[2])
    assert "| LLM alone | 0 | 90.00 |" in text and text.count("<- chosen") == 1 and "| R-Stitch | 0.01 |" in text


def test_llm_alone_latency_is_a_prefill_then_decode_steps():
    class Flat:  # 1 ms per call, 0.5 ms per token of a prefill
        def predict_trace(self, trace):
            return sum(1.0 + 0.5 * (c["n_inf"] - 1) for c in trace["calls"])

    assert llm_alone_ms(Flat(), prompt_len=5, n_tokens=3) == (1.0 + 2.0) + 1.0 + 1.0


def test_new_tokens_stop_at_the_first_eos():
    """A row of a batch counts its tokens up to its first EOS (what the sweep's records count)."""
    class Model:
        generation_config = type("Config", (), {"eos_token_id": 3})()

    method = LLMOnly(Model(), Model(), GenSettings())
    assert [method._row_length(None, r, new) for r, new in enumerate([[4, 5, 3, 0], [4, 4, 4, 4]])] == [3, 4]


@pytest.mark.slow
@pytest.mark.skipif(not assets_present(), reason="the shipped pair is not in this checkout")
def test_cli_on_the_shipped_pair_writes_the_config(tmp_path, capsys):
    rc = main(["tune", "--llm", "shipped:llm", "--slm", "shipped:slm", "--max-drop", "100", "--n", "2",
               "--thresholds", "0.01", "--max-new-tokens", "24", "--latency", "shipped:latency",
               "--no-progress", "--write-config", str(tmp_path / "cfg")])
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    assert rc == 0 and result["threshold"] == 0.01 and result["n"] == 2 and "| R-Stitch | 0.01 |" in out
    assert result["models"]["llm"]["name"] == "shipped:llm" and result["models"]["llm"]["fingerprint"]
    saved = json.loads((tmp_path / "cfg" / "generation_config.json").read_text())
    assert saved["stitch_threshold"] == 0.01 and saved["_from_model_config"] is False
    assert saved["stitch_slm_name_or_path"] == "shipped:slm"  # not a path into this install (issue 35, item 9)


def test_cli_refuses_a_speed_target_without_latency(capsys):
    assert main(["tune", "--llm", "a", "--slm", "b", "--target-speedup", "2"]) == 2
    assert "--latency" in capsys.readouterr().err
