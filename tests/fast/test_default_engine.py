"""What runs when the caller names no engine: ``"auto"`` (the fast engine where it runs the pair, the eager
engine otherwise), or the engine ``HF_RSTITCH_ENGINE`` names; a named engine always wins."""

import pytest
import torch

import hf_rstitch
from hf_rstitch import Role
from hf_rstitch.engine.config import ENGINE_ENV, requested_engine
from hf_rstitch.batching.requests import Request, RequestEngine
from hf_rstitch.fast import NO_TRITON, FastLane
from hf_rstitch.fast import engine as fast_engine
from tiny_models import make_pair, prompt

EAGERLY = "runs its static-cache steps eagerly"  # the fast lanes' warning off CUDA


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv(ENGINE_ENV, raising=False)


@pytest.fixture
def fast_runs(monkeypatch):
    """As on a GPU without Triton: auto picks the fast engine with NO_TRITON (runs on CPU, eagerly)."""
    monkeypatch.setattr(fast_engine, "why_not_fast", lambda *a: None)
    monkeypatch.setattr(fast_engine, "why_not_triton", lambda: "hidden by the test")


def _generate(llm, slm, **kw):
    return llm.generate(prompt(6), assistant_model=slm, stitch_threshold=0.7, max_new_tokens=12,
                        return_dict_in_generate=True, output_logits=True, **kw)


def _same(a, b):
    assert torch.equal(a.sequences, b.sequences) and a.stitch.roles == b.stitch.roles
    assert all(torch.allclose(x, y, atol=1e-9) for x, y in zip(a.logits, b.logits))


def test_no_engine_named_on_cpu_runs_the_eager_engine():
    llm, slm = make_pair("llama")
    got = _generate(llm, slm)
    want = _generate(llm, slm, stitch_engine="default")
    assert torch.equal(got.sequences, want.sequences) and got.stitch.roles == want.stitch.roles
    assert all(torch.equal(x, y) for x, y in zip(got.logits, want.logits))
    assert len(set(got.stitch.roles)) == 2  # tau = 0.7 really stitches
    assert fast_engine.ATTRIBUTE not in llm.__dict__  # no fast engine was made


def test_where_the_fast_engine_runs_no_engine_named_uses_it_and_keeps_it(fast_runs):
    llm, slm = make_pair("llama")
    want = _generate(llm, slm, stitch_engine="default")
    with pytest.warns(UserWarning, match=EAGERLY):
        first = _generate(llm, slm)
    second = _generate(llm, slm)
    engine = llm.__dict__[fast_engine.ATTRIBUTE][NO_TRITON]
    assert engine.builds == 2  # one lane per model, built by the first call; the second reused them
    _same(first, want)
    _same(second, want)


def test_the_environment_variable_applies_only_where_no_engine_is_named(fast_runs, monkeypatch):
    llm, slm = make_pair("llama")
    monkeypatch.setenv(ENGINE_ENV, "default")
    _generate(llm, slm)
    assert fast_engine.ATTRIBUTE not in llm.__dict__  # eager, though the fast engine could run
    with pytest.warns(UserWarning, match=EAGERLY):
        _generate(llm, slm, stitch_engine="auto")  # named: the variable does not apply
    assert list(llm.__dict__[fast_engine.ATTRIBUTE]) == [NO_TRITON]


def test_requested_engine_reads_the_variable(monkeypatch):
    assert requested_engine(None) == "auto"
    monkeypatch.setenv(ENGINE_ENV, " Fast ")
    assert requested_engine(None) == "fast"
    assert requested_engine("default") == "default"
    monkeypatch.setenv(ENGINE_ENV, "")
    assert requested_engine(None) == "auto"
    monkeypatch.setenv(ENGINE_ENV, "turbo")
    with pytest.raises(ValueError, match=r"HF_RSTITCH_ENGINE='turbo' names no stitch engine; expected one of "
                                         r"default, fast, auto"):
        requested_engine(None)
    llm, slm = make_pair("llama")
    with pytest.raises(ValueError, match="HF_RSTITCH_ENGINE='turbo'"):
        _generate(llm, slm)


def test_request_engine_defaults(fast_runs, monkeypatch):
    llm, slm = make_pair("llama")
    with pytest.warns(UserWarning, match=EAGERLY):
        fast = RequestEngine.of(llm, slm, threshold=0.7, max_batch=2)
    assert isinstance(fast.lanes[Role.LLM], FastLane) and fast.lanes[Role.LLM].config == NO_TRITON
    monkeypatch.setenv(ENGINE_ENV, "default")
    eager = RequestEngine.of(llm, slm, threshold=0.7, max_batch=2)
    assert type(eager.lanes[Role.LLM]).__name__ == "Lane"
    request = Request(prompt(6)[0].tolist(), max_new_tokens=12)
    want = _generate(llm, slm, stitch_engine="default").sequences[0, 6:].tolist()
    assert fast.run([request])[request.request_id].tokens == want
    assert eager.run([request])[request.request_id].tokens == want


def test_request_engine_without_an_engine_on_cpu_is_eager():
    llm, slm = make_pair("llama")
    assert type(RequestEngine.of(llm, slm).lanes[Role.SLM]).__name__ == "Lane"


def test_the_cli_configs_default_to_auto_or_the_variable(monkeypatch):
    from hf_rstitch.cli.main import build_parser
    from hf_rstitch.eval import EvalConfig
    from hf_rstitch.serve.config import ServeConfig

    assert EvalConfig(llm="a", slm="b", data=["x.jsonl"]).engine.kind == "auto"
    assert ServeConfig().engine.kind == "auto"
    monkeypatch.setenv(ENGINE_ENV, "default")
    assert EvalConfig(llm="a", slm="b", data=["x.jsonl"]).engine.kind == "default"
    assert EvalConfig(llm="a", slm="b", data=["x.jsonl"], engine="fast").engine.kind == "fast"
    assert ServeConfig().engine.kind == "default" and ServeConfig(engine="auto").engine.kind == "auto"
    for command in ("eval", "serve", "generate"):
        sub = build_parser()._subparsers._group_actions[0].choices[command]
        (flag,) = [a for a in sub._actions if "--engine" in a.option_strings]
        assert flag.default is None and "HF_RSTITCH_ENGINE" in flag.help and "auto (the default" in flag.help
    from hf_rstitch.cli.generate import GenerateConfig

    assert GenerateConfig().engine == "default"  # the variable still says default
    with pytest.raises(ValueError, match="--engine must be default, fast or auto, got 'turbo'"):
        ServeConfig(engine="turbo")
    with pytest.raises(ValueError, match="--engine must be default, fast or auto, got 'turbo'"):
        GenerateConfig(engine="turbo")


assert hf_rstitch  # generate is patched on import
