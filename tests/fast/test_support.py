"""What "auto" runs on the fast engine (hf_rstitch.fast.support) and how it never fails where the eager engine works:
cache shapes from the layers, windows seen in Mistral-style configs, dtype and capability checks, and a fast-engine
failure falling back to the eager engine for that call (and later ones of the pair)."""

import logging

import pytest
import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, MistralConfig, MistralForCausalLM

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch.engine import EngineConfig, Pair, choose
from hf_rstitch.engine import engine as engine_build
from hf_rstitch.fast import FastConfig, check_supported, support
from hf_rstitch.fast import config as fast_config
from hf_rstitch.fast import engine as fast_engine
from hf_rstitch.fast.kv_shapes import kv_shape
from hf_rstitch.fast.lane import FastLane
from tiny_models import SPECIAL, left_pad, prompt

STATIC = FastConfig(graphs=False)


def _pair(make):
    torch.manual_seed(0)
    llm, slm = make(64, 3), make(32, 2)
    for m in (llm, slm):
        m.eval().generation_config.update(**SPECIAL)
    return llm, slm


def _generate(llm, slm, ids, engine, mask=None, **kw):
    kw.setdefault("max_new_tokens", 8)
    return llm.generate(ids, attention_mask=torch.ones_like(ids) if mask is None else mask, assistant_model=slm,
                        stitch_threshold=0.5, stitch_engine=engine, **kw)


def _neox(hidden, layers):
    # num_key_value_heads: an attribute GPT-NeoX's layers ignore (every head has its own keys and values)
    cfg = GPTNeoXConfig(vocab_size=96, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                        intermediate_size=2 * hidden, initializer_range=0.3, **SPECIAL)
    cfg.num_key_value_heads = 2
    return GPTNeoXForCausalLM(cfg)


def test_the_static_cache_is_shaped_by_what_the_layers_store():
    llm, slm = _pair(_neox)
    assert kv_shape(llm) == (3, 4, 16)  # 4 heads of 16, not the config's 2 KV heads
    ids, mask = left_pad([prompt(9), prompt(5, seed=1)])
    want = _generate(llm, slm, ids, "default", mask)
    assert torch.equal(_generate(llm, slm, ids, STATIC, mask), want)


def _mistral(hidden, layers):
    cfg = MistralConfig(vocab_size=96, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=4, initializer_range=0.3,
                        **SPECIAL)
    return MistralForCausalLM(cfg)


def test_a_mistral_window_without_layer_types_is_seen_and_honoured():
    """Mistral-7B-v0.1's config style: ``sliding_window`` set, no ``layer_types`` nor ``use_sliding_window``. Its
    layers attend through the window on every layer; so does the static cache (it attended past it before:
    other tokens on a 19-token context)."""
    llm, slm = _pair(_mistral)
    assert not hasattr(llm.config, "use_sliding_window") and not getattr(llm.config, "layer_types", None)
    ids = prompt(11)  # + 8 new tokens: 19 columns, far past the window of 4
    assert torch.equal(_generate(llm, slm, ids, STATIC), _generate(llm, slm, ids, "default"))
    assert torch.equal(_generate(llm, slm, ids, "auto"), _generate(llm, slm, ids, "default"))


def test_windowed_reads_every_config_style():
    assert fast_config.windowed(MistralConfig(sliding_window=4))
    assert not fast_config.windowed(MistralConfig(sliding_window=None))
    from transformers import Qwen2Config

    assert not fast_config.windowed(Qwen2Config(sliding_window=4, use_sliding_window=False))
    assert fast_config.windowed(Qwen2Config(sliding_window=4, use_sliding_window=True, max_window_layers=0))


class _Cuda:
    type = "cuda"


def test_bfloat16_is_refused_below_compute_capability_8(monkeypatch):
    llm, slm = _pair(_mistral)
    llm = llm.to(torch.bfloat16)
    monkeypatch.setattr(type(llm), "device", property(lambda self: _Cuda()))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    reason = fast_config.dtype_refusal(llm)
    assert "bfloat16" in reason and "7.5" in reason and "float16" in reason
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert fast_config.dtype_refusal(llm) is None


def test_auto_runs_only_proven_architectures_and_capabilities(monkeypatch):
    llm, slm = _pair(_neox)
    kv_shape(llm), kv_shape(slm)  # probed on the CPU (then kept): the GPU below is pretend
    monkeypatch.setattr(support, "PROVEN", frozenset({"llama"}))
    assert "architecture 'gpt_neox', which the fast engine has not been proven" in support.why_not_fast(llm, slm)
    monkeypatch.setattr(support, "PROVEN", frozenset({"gpt_neox"}))
    for model in (llm, slm):
        monkeypatch.setattr(type(model), "device", property(lambda self: torch.device("cuda", 0)))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A10")
    monkeypatch.setattr(fast_config, "dtype_refusal", lambda model: None)
    assert "compute capability 8.6), where the fast engine has not been proven" in support.why_not_fast(llm, slm)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert support.why_not_fast(llm, slm) is None


@pytest.fixture
def auto_is_fast(monkeypatch):
    """"auto" picks the fast engine's static-cache path on the CPU, as it picks AUTO on a GPU."""
    monkeypatch.setattr(fast_engine, "why_not_fast", lambda *a: None)
    monkeypatch.setattr(fast_engine, "why_not_triton", lambda: None)
    monkeypatch.setattr(fast_engine, "AUTO", STATIC)
    monkeypatch.setattr(engine_build, "_SAID", set())


def test_a_lane_that_fails_to_build_falls_back_to_the_eager_engine_once(auto_is_fast, monkeypatch, caplog):
    llm, slm = _pair(_neox)

    def broken(*a, **k):
        raise RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture")

    monkeypatch.setattr(FastLane, "__init__", broken)
    log = logging.getLogger("hf_rstitch.fast")
    log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="hf_rstitch.fast"):
            got = _generate(llm, slm, prompt(9), None)
    finally:
        log.removeHandler(caplog.handler)
    assert torch.equal(got, _generate(llm, slm, prompt(9), "default"))
    warned = {r.getMessage() for r in caplog.records if r.levelno == logging.WARNING}  # (seen by two handlers)
    assert len(warned) == 1 and "Cannot copy between CPU and CUDA" in warned.pop()
    assert "failed on the fast engine earlier" in support.why_not_fast(llm, slm)
    monkeypatch.setattr(fast_engine, "why_not_fast", support.why_not_fast)  # later calls go eager directly
    assert choose(Pair.of(llm, slm), EngineConfig(kind="auto")).kind == "default"
    with pytest.raises(RuntimeError, match="during CUDA graph capture"):  # by name: the error is the caller's
        _generate(llm, slm, prompt(9), STATIC)


class _Streamer:
    def __init__(self):
        self.steps = []

    def put(self, value):
        self.steps.append(value)

    def end(self):
        pass


def test_a_failure_after_streamed_tokens_reruns_eagerly_from_the_same_rng_state(auto_is_fast, monkeypatch):
    llm, slm = _pair(_neox)
    calls, advance = [0], FastLane.advance

    def fails_later(self, *a, **k):
        calls[0] += 1
        if calls[0] == 5:
            raise RuntimeError("a capture of a new bucket failed")
        return advance(self, *a, **k)

    monkeypatch.setattr(FastLane, "advance", fails_later)
    ids, mask = left_pad([prompt(9), prompt(5, seed=1)])
    streamer = _Streamer()
    torch.manual_seed(3)
    got = _generate(llm, slm, ids, None, mask, do_sample=True, streamer=streamer)
    assert calls[0] == 5  # it failed mid-way, after streaming
    torch.manual_seed(3)
    want = _generate(llm, slm, ids, "default", mask, do_sample=True)
    assert torch.equal(got, want)
    new = torch.stack([s.reshape(-1) for s in streamer.steps[1:]], dim=1)  # steps[0]: generate's prompt
    assert torch.equal(new, want[:, ids.shape[1]:])  # each step streamed once, the eager engine's tokens


def test_the_proven_set_agrees_with_every_zoo_result():
    """benchmarks/results/zoo_<device>.json (benchmarks/zoo.py: the GPU run, and the CPU static path): every
    architecture auto runs fast gave the eager engine's tokens on the fast engine by name there (or that
    configuration of it was refused up front), and where auto ran it fast, the eager engine's tokens."""
    import json
    from pathlib import Path

    files = sorted(Path(__file__).resolve().parents[2].glob("benchmarks/results/zoo_*.json"))
    if not files:
        pytest.skip("no zoo result yet (run benchmarks/zoo.py)")
    for path in files:
        rows = json.loads(path.read_text())["architectures"]
        for model_type in sorted(support.PROVEN & set(rows)):
            row = rows[model_type]
            if "excluded" in row or "fast_by_name" not in row:
                continue  # not run there (an older transformers, the run's budget)
            by_name = row["fast_by_name"]  # equal, or refused up front (the zoo's Mistral has a window)
            assert by_name.get("equal") is True or by_name.get("refused"), (path.name, model_type, by_name)
            if row.get("engine") == "fast":
                assert row.get("equal") is True and not row.get("error"), (path.name, model_type, row)


def test_layers_that_attend_with_their_own_code_are_refused_by_name():
    """Falcon's layers store into the cache but attend with code of their own (an additive float mask), not
    through transformers' attention interface the fast engine replaces: other tokens if it were let through."""
    from transformers import FalconConfig, FalconForCausalLM

    cfg = FalconConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, **SPECIAL)
    llm = slm = FalconForCausalLM(cfg).eval()
    with pytest.raises(ValueError, match="attend with code of their own"):
        check_supported(llm)
    with pytest.raises(ValueError, match="attend with code of their own"):
        _generate(llm, slm, prompt(9), STATIC)
    assert torch.equal(_generate(llm, slm, prompt(9), "auto"), _generate(llm, slm, prompt(9), "default"))
