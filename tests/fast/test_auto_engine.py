"""stitch_engine="auto": the fast engine where it runs the pair, the eager engine otherwise, with the reason logged."""

import logging

import pytest
import torch

import hf_rstitch
from hf_rstitch import ReplayPolicy
from hf_rstitch.fast import AUTO, choose_engine, why_not_fast
from hf_rstitch.fast import engine as fast_engine
from tiny_models import make_pair, prompt

ROUTE = ["slm", "llm", "llm", "slm", "slm", "slm"]


def _generate(llm, slm, ids, engine):
    return llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=slm,
                        stitch_policy=ReplayPolicy(ROUTE), stitch_engine=engine, max_new_tokens=len(ROUTE),
                        return_dict_in_generate=True, output_logits=True)


def test_auto_off_cuda_runs_the_eager_engine_and_says_why(caplog):
    llm, slm = make_pair("llama")
    log = logging.getLogger("hf_rstitch.fast")
    log.addHandler(caplog.handler)  # directly: the CLI's tests may stop hf_rstitch's records reaching the root
    try:
        with caplog.at_level(logging.INFO, logger="hf_rstitch.fast"):
            auto = _generate(llm, slm, prompt(5), "auto")
    finally:
        log.removeHandler(caplog.handler)
    assert "stitch_engine='auto' runs the eager engine: the llm is on cpu" in caplog.text
    eager = _generate(llm, slm, prompt(5), "default")
    assert torch.equal(auto.sequences, eager.sequences)
    assert all(torch.equal(a, b) for a, b in zip(auto.logits, eager.logits))


def test_unsupported_models_are_named_before_the_device():
    llm, slm = make_pair("qwen2")  # sliding window on every layer
    assert "full-attention models only" in why_not_fast(llm, slm)
    assert why_not_fast(*make_pair("llama")).endswith("the fast engine's graphs need CUDA")


def test_auto_picks_the_fast_engine_where_it_runs(monkeypatch):
    llm, slm = make_pair("llama")
    monkeypatch.setattr(fast_engine, "why_not_fast", lambda *a: None)
    assert choose_engine(llm, slm, "auto") is AUTO
    assert AUTO.compile == "parts"


@pytest.mark.parametrize("spec", ["default", "fast"])
def test_other_specs_pass_through(spec):
    llm, slm = make_pair("llama")
    assert choose_engine(llm, slm, spec) == spec


assert hf_rstitch  # generate is patched on import
