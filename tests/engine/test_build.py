"""build(pair, cfg): the lanes, the KV plan, warm-up, and one fallback that is taken once, with a logged reason."""

import logging

import pytest
import torch

from hf_rstitch import Role
from hf_rstitch.engine import EngineConfig, Pair, build
from hf_rstitch.engine import engine as engine_build
from hf_rstitch.engine.config import ENGINE_ENV
from hf_rstitch.engine.kv_plan import CPU_ROW_TOKENS, kv_plan
from hf_rstitch.fast import FastConfig, FastLane, support
from hf_rstitch.fast import engine as fast_engine
from tiny_models import make_pair

STATIC = FastConfig(graphs=False)


@pytest.fixture
def auto_is_fast(monkeypatch):
    """"auto" picks the fast engine's static-cache path on the CPU, as it picks AUTO on a GPU."""
    monkeypatch.delenv(ENGINE_ENV, raising=False)
    monkeypatch.setattr(fast_engine, "why_not_fast", lambda *a: None)
    monkeypatch.setattr(fast_engine, "why_not_triton", lambda: None)
    monkeypatch.setattr(fast_engine, "AUTO", STATIC)
    monkeypatch.setattr(engine_build, "_SAID", set())


def test_the_kv_plan_has_no_fixed_cap():
    """The longest request is the LLM's context window (or --max-model-len), bounded by the KV memory only."""
    llm, slm = make_pair("llama")
    pair = Pair.of(llm, slm)
    context = llm.config.max_position_embeddings
    assert build(pair, EngineConfig(kind="default", requests=True)).max_length is None  # eager: no pool
    assert kv_plan(pair, EngineConfig(kind="fast", max_batch=2)) == (min(context, 2 * CPU_ROW_TOKENS),
                                                                    2 * CPU_ROW_TOKENS)
    assert kv_plan(pair, EngineConfig(kind="fast", max_length=40))[0] == 40
    assert kv_plan(pair, EngineConfig(kind="fast", max_length=40, kv_memory=None, max_batch=2)) == (40, 80)
    assert kv_plan(pair, EngineConfig(kind="fast", max_length=40, kv_tokens=32)) == (40, 32)
    assert kv_plan(pair, EngineConfig(kind="fast", paged=False)) == (context, None)
    llm.config.max_position_embeddings = 32768
    assert kv_plan(pair, EngineConfig(kind="fast", max_batch=64)) == (32768, 64 * CPU_ROW_TOKENS)


def test_request_lanes_are_built_at_build_time():
    pair = Pair.of(*make_pair("llama"))
    eager = build(pair, EngineConfig(kind="default", requests=True, max_batch=3))
    assert eager.kind == "default" and eager.lanes()[Role.LLM].seen.shape == (0,)  # rows join later
    fast = build(pair, EngineConfig.of(STATIC, requests=True, max_batch=3, max_length=64, kv_memory=None))
    lanes = fast.lanes()
    assert isinstance(lanes[Role.LLM], FastLane) and (fast.max_length, fast.kv_tokens) == (64, 192)
    assert fast.builder.builds == 2  # proven at build, reused after


def test_a_failing_fast_build_falls_back_once_with_a_logged_reason(auto_is_fast, monkeypatch, caplog):
    llm, slm = make_pair("llama")

    def broken(*a, **k):
        raise RuntimeError("a capture read the host")

    monkeypatch.setattr(FastLane, "__init__", broken)
    log = logging.getLogger("hf_rstitch.fast")
    log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="hf_rstitch.fast"):
            engine = build(Pair.of(llm, slm), EngineConfig(kind="auto", requests=True, max_length=32, kv_memory=None))
    finally:
        log.removeHandler(caplog.handler)
    warned = {r.getMessage() for r in caplog.records if r.levelno == logging.WARNING}
    assert len(warned) == 1 and "RuntimeError: a capture read the host" in warned.pop()
    assert engine.kind == "default" and engine.reason.startswith("the fast engine failed: RuntimeError")
    assert engine.max_length is None and not engine.may_fall_back  # the eager engine never falls back again
    assert "failed on the fast engine earlier" in support.why_not_fast(llm, slm)
    monkeypatch.setattr(fast_engine, "why_not_fast", support.why_not_fast)  # the real check: it remembers
    again = build(Pair.of(llm, slm), EngineConfig(kind="auto", requests=True))
    assert again.kind == "default" and "failed on the fast engine earlier" in again.reason


def test_a_named_fast_engine_s_failure_is_raised(auto_is_fast, monkeypatch):
    monkeypatch.setattr(FastLane, "__init__", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no")))
    with pytest.raises(RuntimeError, match="no"):
        build(Pair.of(*make_pair("llama")), EngineConfig.of(STATIC, requests=True, max_length=32))


def test_generate_s_engine_is_the_one_kept_on_the_llm(auto_is_fast):
    llm, slm = make_pair("llama")
    engine = build(Pair.of(llm, slm), EngineConfig(kind="auto", shared=True, max_batch=2, max_length=16))
    assert engine.builder is llm.__dict__[fast_engine.ATTRIBUTE][STATIC]
    assert engine.builder.builds == 0  # generate's lanes are built by the run, inside its fallback
    lanes = engine.lanes()
    assert lanes[Role.SLM].max_rows >= 2 and lanes[Role.LLM].capacity >= 16


def test_the_pair_carries_vocab_eos_and_pad():
    llm, slm = make_pair("llama")
    pair = Pair.of(llm, slm)
    assert pair.vocab == min(llm.get_output_embeddings().weight.shape[0], slm.get_output_embeddings().weight.shape[0])
    assert pair.device == llm.device and pair.eos == frozenset(
        [llm.generation_config.eos_token_id] if isinstance(llm.generation_config.eos_token_id, int)
        else llm.generation_config.eos_token_id or [])
    with pytest.raises(ValueError, match="without a small model"):
        Pair.of(llm, None)


def test_tokens_equal_on_the_built_engines():
    """The engine built for generate's defaults decodes as generate does: stitch_loop on a built engine."""
    from hf_rstitch.core.policies import EntropyPolicy
    from hf_rstitch.decode.loop import stitch_loop

    llm, slm = make_pair("llama")
    pair, ids = Pair.of(llm, slm), torch.tensor([[3, 5, 7, 9]])
    stop = lambda seq, scores: torch.full((seq.shape[0],), seq.shape[1] >= 10)  # noqa: E731
    runs = [stitch_loop(build(pair, EngineConfig.of(spec, max_length=10, max_batch=1)), ids, torch.ones_like(ids),
                        EntropyPolicy(0.5), None, stop).sequences for spec in ("default", STATIC)]
    assert torch.equal(*runs)
