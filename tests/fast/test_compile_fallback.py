"""compile="parts": a piece torch.compile cannot compile runs its eager code, said once, and the lanes still equal
the eager engine (hf_rstitch.fast.patches.regions). On the GPU, torch 2.11's inductor cannot lower the rotary functions
of GLM / Cohere-family models (``KeyError: 'unbacked_bindings'``, pytorch issue 174340, fixed in later torch);
here a compile failure of the same piece is forced, with the exception torch.compile really raises."""

import logging
import sys
import warnings

import pytest
import torch

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch.fast import FastConfig
from hf_rstitch.fast.patches import regions

CPU = dict(attention="matmul", gemv=False, fuse_mlp=False, fuse_rope_store=False, graphs=False)


def _compile_error() -> Exception:
    """What torch.compile(fullgraph=True) raises on a function it cannot compile whole."""
    def breaks(x):
        torch._dynamo.graph_break()
        return x + 1

    try:
        torch.compile(breaks, fullgraph=True)(torch.ones(2))
    except regions._compile_errors() as err:
        return err
    pytest.skip("this torch compiles a graph break whole")


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(regions, "_COMPILED", {})
    monkeypatch.setattr(regions, "EAGER", {})


def test_a_piece_that_does_not_compile_runs_eagerly(fresh, caplog):
    def breaks(x):
        torch._dynamo.graph_break()
        return x * 2

    piece = regions._compiled(("test", breaks), breaks)
    with caplog.at_level(logging.WARNING, logger="hf_rstitch.fast"):
        assert torch.equal(piece(torch.ones(3)), torch.full((3,), 2.0))
        assert torch.equal(piece(torch.ones(4)), torch.full((4,), 2.0))
    assert ("test", breaks) in regions.EAGER
    assert len([r for r in caplog.records if "runs" in r.getMessage() and "eagerly" in r.getMessage()]) == 1


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["glm4", "cohere"])
def test_parts_with_a_rotary_that_does_not_compile_equal_the_eager_engine(model_type, fresh, monkeypatch):
    sys.path.insert(0, "tests")
    from zoo_models import build_pair, pick_threshold, stitched

    error = _compile_error()
    compile_ = torch.compile

    def compile_but_rotary(fn, **kw):
        if fn.__name__ != "apply_rotary_pos_emb":
            return compile_(fn, **kw)

        def fails(*a, **k):
            raise error
        return fails

    monkeypatch.setattr(regions.torch, "compile", compile_but_rotary)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        llm, slm = build_pair(model_type)
        tau = pick_threshold(slm)
        want = stitched(llm, slm, "greedy", 3, tau, "default")
        got = stitched(llm, slm, "greedy", 3, tau, FastConfig(compile="parts", **CPU))
    assert torch.equal(got[0], want[0]) and got[1] == want[1]
    assert any(key[0] == "rotary" for key in regions.EAGER)  # the rotary piece ran eagerly, the rest compiled
