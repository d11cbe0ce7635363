"""stitch_engine="auto": the fast engine where it runs the pair, the eager engine otherwise, with the reason logged;
Triton missing -> graphs without compile or Triton kernels; changed weights -> the kept lanes are rebuilt."""

import logging
import sys
from contextlib import contextmanager

import pytest
import torch

import hf_rstitch
from hf_rstitch import ReplayPolicy
from hf_rstitch.engine import EngineConfig, Pair, choose
from hf_rstitch.engine import engine as engine_build
from hf_rstitch.fast import AUTO, NO_TRITON, FastConfig, FastEngine, why_not_fast, why_not_triton
from hf_rstitch.fast import engine as fast_engine
from tiny_models import make_pair, prompt

ROUTE = ["slm", "llm", "llm", "slm", "slm", "slm"]


def _generate(llm, slm, ids, engine):
    return llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=slm,
                        stitch_policy=ReplayPolicy(ROUTE), stitch_engine=engine, max_new_tokens=len(ROUTE),
                        return_dict_in_generate=True, output_logits=True)


@pytest.fixture(autouse=True)
def unsaid(monkeypatch):
    monkeypatch.setattr(engine_build, "_SAID", set())  # each test sees the first (INFO) record of its reasons


@contextmanager
def fast_log(caplog):
    log = logging.getLogger("hf_rstitch.fast")
    log.addHandler(caplog.handler)  # directly: the CLI's tests may stop hf_rstitch's records reaching the root
    try:
        with caplog.at_level(logging.INFO, logger="hf_rstitch.fast"):
            yield
    finally:
        log.removeHandler(caplog.handler)


def test_auto_off_cuda_runs_the_eager_engine_and_says_why(caplog):
    llm, slm = make_pair("llama")
    with fast_log(caplog):
        auto = _generate(llm, slm, prompt(5), "auto")
    assert "stitch_engine='auto' runs the eager engine: the llm is on cpu" in caplog.text
    eager = _generate(llm, slm, prompt(5), "default")
    assert torch.equal(auto.sequences, eager.sequences)
    assert all(torch.equal(a, b) for a, b in zip(auto.logits, eager.logits))


def test_each_reason_is_said_at_info_once(monkeypatch):
    said = []
    monkeypatch.setattr(engine_build.log, "log", lambda level, msg, *a: said.append((level, msg)))
    llm, slm = make_pair("llama")
    for _ in range(3):
        _generate(llm, slm, prompt(5), "auto")
    assert [level for level, msg in said if "runs the eager engine" in msg] == [logging.INFO, logging.DEBUG,
                                                                                 logging.DEBUG]


def test_unsupported_models_are_named_before_the_device():
    llm, slm = make_pair("llama")
    llm.config.layer_types = ["chunked_attention"] * llm.config.num_hidden_layers  # as Llama 4's chunked layers
    assert "layer types ['chunked_attention']" in why_not_fast(llm, slm)
    assert why_not_fast(*make_pair("llama")).endswith("the fast engine's graphs need CUDA")
    llm, slm = make_pair("llama")
    llm.hf_quantizer = object()  # what transformers sets on a model loaded with a quantization_config
    assert why_not_fast(llm, slm) == "the llm is quantized; the fast engine is tested on unquantized weights only"


def test_auto_picks_the_fast_engine_where_it_runs(monkeypatch):
    llm, slm = make_pair("llama")
    monkeypatch.setattr(fast_engine, "why_not_fast", lambda *a: None)
    monkeypatch.setattr(fast_engine, "why_not_triton", lambda: None)
    assert choose(Pair.of(llm, slm), EngineConfig(kind="auto")).fast is AUTO
    assert AUTO.compile == "parts"


def test_without_triton_auto_runs_graphs_without_compile_and_says_why(monkeypatch, caplog):
    llm, slm = make_pair("llama")
    monkeypatch.setattr(fast_engine, "why_not_fast", lambda *a: None)  # as if on CUDA
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    assert why_not_triton().startswith("triton is not importable (ModuleNotFoundError")
    with fast_log(caplog):
        assert choose(Pair.of(llm, slm), EngineConfig(kind="auto")).fast is NO_TRITON
    assert "runs the fast engine without torch.compile or Triton kernels" in caplog.text
    assert "triton is not importable" in caplog.text
    assert (NO_TRITON.compile, NO_TRITON.gemv, NO_TRITON.attention) == (None, False, "matmul")


def test_without_a_c_compiler_triton_cannot_build_its_launchers(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(fast_engine.shutil, "which", lambda name: None)
    assert "no C compiler" in why_not_triton()
    monkeypatch.setenv("CC", "/opt/cc")
    assert why_not_triton() is None


@pytest.mark.parametrize("spec", ["default", "fast"])
def test_other_specs_pass_through(spec):
    llm, slm = make_pair("llama")
    assert choose(Pair.of(llm, slm), EngineConfig(kind=spec)).kind == spec


def test_changed_weights_rebuild_the_kept_lanes():
    """A lane keeps copies of weights (fused q/k/v) and graphs read their storage: after an in-place update
    (an optimizer step) or new tensors (``.to``), the engine builds new lanes instead of decoding stale weights."""
    llm, slm = make_pair("llama")
    engine = FastEngine(FastConfig(graphs=False))
    _generate(llm, slm, prompt(5), engine)
    _generate(llm, slm, prompt(5), engine)
    assert engine.builds == 2  # reused
    with torch.no_grad():
        llm.model.layers[0].self_attn.q_proj.weight.mul_(1.5)
    out = _generate(llm, slm, prompt(5), engine)
    assert engine.builds == 3  # the LLM's lane only
    eager = _generate(llm, slm, prompt(5), "default")
    assert torch.equal(out.sequences, eager.sequences)
    assert all(torch.allclose(a, b, atol=1e-9) for a, b in zip(out.logits, eager.logits))
    slm.float().double()  # new parameter tensors
    _generate(llm, slm, prompt(5), engine)
    assert engine.builds == 4


assert hf_rstitch  # generate is patched on import
