"""The serving benchmarks' counting rules (benchmarks/serve_clients.py, serve_reasoning.py), on hand-made records:
a window counts the requests completed in it and the tokens streamed in it, for every method alike."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import serve_clients as sc  # noqa: E402
import serve_reasoning as sr  # noqa: E402


def rec(start, end, chunks, complete=True, status=200, error=None, target=None):
    return {"start": start, "end": end, "chunks": chunks, "complete": complete, "status": status, "error": error,
            "ttft_s": chunks[0][0] - start if chunks else None,
            "target": sum(n for _, n in chunks) if target is None else target}


def test_window_counts_tokens_and_request_shares_inside_it():
    records = [rec(0.0, 1.5, [(0.5, 1), (1.0, 1), (1.5, 1)]),  # before the window: nothing counted
               rec(1.0, 3.0, [(1.5, 1), (2.0, 2), (3.0, 1)]),  # completes inside: 3 of its 4 tokens inside
               rec(2.5, 6.0, [(3.5, 4), (5.5, 1)], target=8),  # ends after: 4 of its 8 tokens inside
               rec(2.0, 2.8, [(2.4, 1)], complete=False, status=503, error="replica lost", target=2)]
    s = sc.summarize(records, 2.0, 4.0)
    assert s["completed"] == 1 and s["completed_per_s"] == 0.5
    assert s["requests_per_s"] == pytest.approx((3 / 4 + 4 / 8 + 1 / 2) / 2.0)  # shares, not whole completions
    assert s["tokens_per_s"] == (2 + 1 + 4 + 1) / 2.0
    assert s["p50_s"] == 2.0 and s["errors"] == 1 and s["statuses"] == [503]
    assert s["ttft_p50_s"] == 1.0  # first tokens inside the window (2.5 + 1.0); the first one (1.5) came before it


def test_request_shares_read_as_completions_in_a_steady_state():
    """Back-to-back requests of 4 tokens, one a second: 0.25 requests/s whatever the window's phase."""
    records = [rec(t, t + 4, [(t + k + 1, 1) for k in range(4)]) for t in range(0, 40, 4)]
    for t0 in (8.0, 8.5, 9.3):
        s = sc.summarize(records, t0, t0 + 6)
        assert s["requests_per_s"] == pytest.approx(s["tokens_per_s"] / 4)


def test_shapes_scale_both_methods_alike():
    shape = sr.shapes(0.1, n=64)
    assert shape["prompt"] == round(128 * 0.1)
    for a, b in zip(shape["llm_only"], shape["stitched"]):  # request i: the same spread factor for both methods
        assert a / b == pytest.approx(2753 / 1115, rel=0.1)
    assert sum(shape["llm_only"]) / 64 == pytest.approx(275.3, rel=0.15)
    assert shape["llm_share"] == pytest.approx(344 / 1115)


def test_replayed_routes_repeat_per_slot():
    from hf_rstitch.core.policies import StepView

    policy = sr.replay_policy(slots=3, llm_share=0.31, device=None, width=64)
    rows = torch.tensor([2, 0])
    at = lambda i: policy.hand_to_llm(StepView(index=i, entropy=torch.zeros(2), rows=rows)).tolist()  # noqa: E731
    assert [at(i) for i in range(64)] == [at(i + 64) for i in range(64)]
    share = policy._llm.float().mean().item()
    assert share == pytest.approx(0.31, abs=0.02)
