"""The request engine under ``"auto"`` never fails where the eager lanes work: a fast engine whose lanes fail
while they are built or warmed up (capture, compile) gives way to the eager lanes with one logged reason
(hf_rstitch.engine.engine: Engine.fall_back), and the requests' tokens are the eager engine's; a named fast engine raises."""

import logging

import pytest

from hf_rstitch import Role
from hf_rstitch.engine.config import ENGINE_ENV
from hf_rstitch.batching.requests import Request, RequestEngine
from hf_rstitch.fast import FastEngine, FastLane, support
from hf_rstitch.fast import engine as fast_engine
from tiny_models import make_pair, prompt

CAPTURE = "Cannot copy between CPU and CUDA tensors during CUDA graph capture"


@pytest.fixture(autouse=True)
def auto_picks_fast(monkeypatch):
    """As on a GPU without Triton: "auto" picks the fast engine (it runs on CPU, eagerly)."""
    monkeypatch.delenv(ENGINE_ENV, raising=False)
    monkeypatch.setattr(fast_engine, "why_not_fast", lambda *a: None)
    monkeypatch.setattr(fast_engine, "why_not_triton", lambda: "hidden by the test")


def _fail(*args, **kwargs):
    raise RuntimeError(CAPTURE)


def _tokens(engine):
    request = Request(prompt(6)[0].tolist(), max_new_tokens=10)
    return engine.run([request])[request.request_id].tokens


@pytest.mark.parametrize("where", ["build", "warm_up"])
def test_fast_lanes_that_fail_give_way_to_the_eager_lanes(where, monkeypatch, caplog):
    llm, slm = make_pair("llama")
    want = _tokens(RequestEngine.of(llm, slm, threshold=0.7, max_batch=2, engine="default"))
    monkeypatch.setattr(*((FastEngine, "lanes", _fail) if where == "build" else (FastLane, "warm_up", _fail)))
    with caplog.at_level(logging.WARNING, logger="hf_rstitch.fast"):
        engine = RequestEngine.of(llm, slm, threshold=0.7, max_batch=2)
    assert type(engine.lanes[Role.LLM]).__name__ == "Lane" and engine.max_length is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and CAPTURE in warnings[0].getMessage()
    assert CAPTURE in support.failure(llm, slm)  # later "auto" calls of the pair go eager directly
    assert _tokens(engine) == want


def test_warmed_fast_lanes_serve_the_pair(monkeypatch):
    llm, slm = make_pair("llama")
    warmed = []
    warm_up = FastLane.warm_up
    monkeypatch.setattr(FastLane, "warm_up", lambda self, *a, **k: warmed.append(k) or warm_up(self, *a, **k))
    with pytest.warns(UserWarning):  # the fast lanes' note that they run eagerly off CUDA
        engine = RequestEngine.of(llm, slm, threshold=0.7, max_batch=2)
    assert isinstance(engine.lanes[Role.LLM], FastLane) and len(warmed) == 2
    assert _tokens(engine) == _tokens(RequestEngine.of(llm, slm, threshold=0.7, max_batch=2, engine="default"))


def test_a_named_fast_engine_raises(monkeypatch):
    llm, slm = make_pair("llama")
    monkeypatch.setattr(FastEngine, "lanes", _fail)
    with pytest.raises(RuntimeError, match="graph capture"):
        RequestEngine.of(llm, slm, threshold=0.7, max_batch=2, engine="fast")
