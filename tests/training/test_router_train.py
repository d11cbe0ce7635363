"""A 2-step DAPO smoke run on tiny in-process models, checkpoint and resume."""

import json

import torch

import hf_rstitch  # noqa: F401
from hf_rstitch.latency import Coefficients, LatencyModel, ModelProfile
from hf_rstitch.router import Router
from hf_rstitch.router.config import RouterTrainConfig
from hf_rstitch.training.router import train_router
from tiny_models import make_pair, make_tokenizer


def _setup():
    llm, slm = make_pair("llama")
    tok = make_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    lm = LatencyModel({"slm": ModelProfile(Coefficients(0, 0, 0.1, 1.0)),
                       "llm": ModelProfile(Coefficients(0, 0, 0.5, 5.0))})
    rows = [{"problem": p, "answer": "x"} for p in ["abc", "hello", "zz top", "q"]]
    return llm, slm, tok, lm, rows


def _grader(text: str, answer: str) -> bool:
    return len(text) % 2 == 0  # arbitrary but varied: groups get non-equal rewards


def test_two_step_training_smoke_and_resume(tmp_path):
    llm, slm, tok, lm, rows = _setup()
    cfg = RouterTrainConfig(out=str(tmp_path), steps=2, batch_prompts=2, group_size=4, threshold=0.1, lam=1e-3,
                            max_new_tokens=8, width=8, num_blocks=2, checkpoint_every=1, device="cpu",
                            progress=False)
    before = Router(32, width=8, num_blocks=2)
    torch.manual_seed(0)
    router = train_router(cfg, llm=llm, slm=slm, tokenizer=tok, latency_model=lm, rows=rows, grader=_grader)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert {"reward", "accuracy", "llm_token_share", "latency_ms", "kept_groups", "loss"} <= set(m)
        assert m["latency_ms"] > 0 and 0 <= m["llm_token_share"] <= 1
    assert any(m["decisions_used"] > 0 for m in lines)
    assert any(not torch.equal(a, b) for a, b in zip(router.state_dict().values(), before.state_dict().values()))
    final = Router.from_pretrained(str(tmp_path / "router"))
    assert final.threshold == 0.1 and final.hidden_size == 32
    # resume: asking for 3 steps runs only the third
    cfg3 = RouterTrainConfig(**{**cfg.to_dict(), "steps": 3})
    train_router(cfg3, llm=llm, slm=slm, tokenizer=tok, latency_model=lm, rows=rows, grader=_grader, log=lambda s: None)
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_config_validation_messages():
    import pytest

    with pytest.raises(ValueError, match="group-size must be >= 2"):
        RouterTrainConfig(group_size=1)
    with pytest.raises(ValueError, match="both --llm and --slm"):
        RouterTrainConfig(llm="a")
