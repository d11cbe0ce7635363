"""choose(pair, cfg): each rule gives its engine and says why; EngineConfig validates and reads a spec."""

import pytest
import torch

from hf_rstitch.decode import EagerEngine
from hf_rstitch.engine import EngineConfig, Pair, choose
from hf_rstitch.engine import engine as engine_build
from hf_rstitch.engine.config import ENGINE_ENV
from hf_rstitch.fast import AUTO, NO_TRITON, FastConfig, FastEngine
from hf_rstitch.fast import engine as fast_engine
from hf_rstitch.fast import support
from tiny_models import make_pair


@pytest.fixture
def pair(monkeypatch):
    monkeypatch.delenv(ENGINE_ENV, raising=False)
    monkeypatch.setattr(engine_build, "_SAID", set())
    return Pair.of(*make_pair("llama"))


def test_a_caller_s_own_builder_runs_as_it_is(pair):
    eager, fast = EagerEngine(), FastEngine(FastConfig(graphs=False))
    assert choose(pair, EngineConfig.of(eager)) == ("default", "the caller's own EagerEngine", None, False, False)
    assert choose(pair, EngineConfig.of(fast)) == ("fast", "the caller's own FastEngine", None, False, False)


def test_default_named_runs_the_eager_lanes(pair):
    kind, reason, config, fallback, _ = choose(pair, EngineConfig(kind="default"))
    assert (kind, config, fallback) == ("default", None, False) and reason.startswith("named")


def test_fast_named_runs_the_caller_s_config_else_fast_config_and_never_falls_back(pair):
    mine = FastConfig(graphs=False)
    assert choose(pair, EngineConfig.of(mine)) == ("fast", "named: stitch_engine='fast'", mine, False, False)
    assert choose(pair, EngineConfig(kind="fast")).fast == FastConfig()
    assert choose(pair, EngineConfig(kind="fast", fast_like_auto=True)).fast == FastConfig()  # CPU: not AUTO


def test_fast_like_auto_on_cuda_runs_auto_s_config(pair, monkeypatch):
    monkeypatch.setattr(type(pair.llm), "device", property(lambda self: torch.device("cuda", 0)))
    assert choose(pair, EngineConfig(kind="fast", fast_like_auto=True)).fast is AUTO


def test_auto_where_the_fast_engine_is_not_proven_runs_eager_and_says_why(pair, caplog):
    kind, reason, config, fallback, _ = choose(pair, EngineConfig())  # None: auto
    assert (kind, config, fallback) == ("default", None, False)
    assert reason == support.why_not_fast(pair.llm, pair.slm) and reason.endswith("graphs need CUDA")


def test_auto_without_triton_runs_graphs_without_compile(pair, monkeypatch):
    monkeypatch.setattr(fast_engine, "why_not_fast", lambda *a: None)
    monkeypatch.setattr(fast_engine, "why_not_triton", lambda: "no triton here")
    assert choose(pair, EngineConfig(kind="auto")) == ("fast", "no triton here", NO_TRITON, True, False)


def test_auto_where_proven_runs_auto_and_may_fall_back(pair, monkeypatch):
    monkeypatch.setattr(fast_engine, "why_not_fast", lambda *a: None)
    monkeypatch.setattr(fast_engine, "why_not_triton", lambda: None)
    kind, reason, config, fallback, _ = choose(pair, EngineConfig(kind="auto"))
    assert (kind, config, fallback) == ("fast", AUTO, True) and "proven" in reason


def test_the_environment_names_the_kind_of_a_config_naming_none(monkeypatch, pair):
    monkeypatch.setenv(ENGINE_ENV, "fast")
    assert EngineConfig().kind == "fast" and EngineConfig(kind="default").kind == "default"
    monkeypatch.setenv(ENGINE_ENV, "turbo")
    with pytest.raises(ValueError, match="names no stitch engine"):
        EngineConfig()


@pytest.mark.parametrize("bad, match", [
    (dict(kind="turbo"), "--engine must be default, fast or auto"), (dict(max_batch=0), "--max-batch"),
    (dict(kv_memory=1.5), "--kv-memory"), (dict(max_length=-1), "--max-model-len"),
    (dict(prefill_chunk=-1), "--prefill-chunk"), (dict(kv_tokens=0), "--kv-tokens"),
    (dict(join_wait=-1), "--join-wait"), (dict(join_group=0), "--join-group")])
def test_engine_config_refuses_bad_values_naming_the_flag(bad, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**bad)


def test_a_spec_that_names_no_engine_is_refused():
    with pytest.raises(ValueError, match="stitch_engine must be None, 'auto', 'default', 'fast'"):
        EngineConfig.of(3)


def test_serve_and_eval_configs_embed_the_engine_config_whole(monkeypatch):
    monkeypatch.delenv(ENGINE_ENV, raising=False)
    from hf_rstitch.eval import EvalConfig
    from hf_rstitch.serve.config import ServeConfig

    cfg = ServeConfig(engine="fast", max_batch=4, max_model_len=40)
    assert cfg.engine == EngineConfig(kind="fast", max_batch=4, max_length=40, requests=True) and cfg.max_batch == 4
    assert ServeConfig(schedule="gather:2:2").engine.spare_columns == 32  # held rows' padding
    assert EvalConfig(llm="a", slm="b", data=["x.jsonl"], engine="fast").engine.fast_like_auto


def test_the_cli_takes_the_engine_config_s_flags(monkeypatch):
    monkeypatch.delenv(ENGINE_ENV, raising=False)
    from hf_rstitch.cli.main import build_parser
    from hf_rstitch.cli.args import dataclass_from_args
    from hf_rstitch.core.scheduling import JoinPacing
    from hf_rstitch.serve.config import ServeConfig

    args = build_parser().parse_args(["serve", "--engine", "fast", "--max-batch", "3", "--max-model-len", "50",
                                      "--kv-tokens", "640", "--no-paged", "--prefill-chunk", "16",
                                      "--join-wait", "4", "--join-group", "6"])
    cfg = dataclass_from_args(ServeConfig, args)
    assert cfg.engine == EngineConfig(kind="fast", max_batch=3, max_length=50, kv_tokens=640, paged=False,
                                      prefill_chunk=16, join_wait=4, join_group=6, requests=True)
    assert cfg.engine.join_pacing() == JoinPacing(join_wait=4, join_group=6)


def test_auto_on_an_unproven_pair_proves_it_on_this_machine(pair, monkeypatch):
    from hf_rstitch.engine.engine import _builder
    from hf_rstitch.fast import proof

    monkeypatch.setattr(fast_engine, "why_not_fast", lambda *a: "unproven here (test)")
    monkeypatch.setattr(fast_engine, "why_not_triton", lambda: None)
    monkeypatch.setattr(proof, "unproven", lambda llm, slm, batch, reason, config, kept: (None, proof.Proving(config, kept)))
    choice = choose(pair, EngineConfig(kind="auto"))
    assert (choice.kind, choice.fast, choice.fallback, choice.proving) == ("fast", AUTO, True, True)
    assert "proving" in choice.reason
    assert isinstance(_builder(pair, EngineConfig(kind="auto"), choice), proof.Proving)
    monkeypatch.setattr(proof, "unproven", lambda llm, slm, batch, reason, config, kept: (reason + "; failed", None))
    assert choose(pair, EngineConfig(kind="auto"))[:2] == ("default", "unproven here (test); failed")


def test_virtual_joins_set_on_the_config_reaches_the_fast_config_the_choice_runs(pair, monkeypatch):
    """``--virtual-joins`` (EngineConfig.virtual_joins) on whichever FastConfig a rule picks; unset, the config's own."""
    mine = FastConfig(graphs=False)
    assert choose(pair, EngineConfig(kind="fast", fast=mine, virtual_joins=0)).fast == FastConfig(graphs=False,
                                                                                                  virtual_joins=0)
    assert choose(pair, EngineConfig(kind="fast")).fast.virtual_joins == FastConfig().virtual_joins == 64
    monkeypatch.setattr(fast_engine, "why_not_fast", lambda *a: None)
    monkeypatch.setattr(fast_engine, "why_not_triton", lambda: None)
    assert choose(pair, EngineConfig(kind="auto", virtual_joins=16)).fast == FastConfig(
        **{**AUTO.__dict__, "virtual_joins": 16})
