"""Router-training checkpoints: one atomic file, loaded without pickle code execution, resumes that
never mix two steps, and metrics.jsonl that never repeats a step after a resume."""

import json
import os
import pickle

import pytest
import torch

import hf_rstitch  # noqa: F401
from hf_rstitch.latency import Coefficients, LatencyModel, ModelProfile
from hf_rstitch.router.config import RouterTrainConfig
from hf_rstitch.training.router import train_router
from tiny_models import make_pair, make_tokenizer

ROWS = [{"problem": p, "answer": "x"} for p in ["abc", "hello", "zz top", "q"]]
LATENCY = LatencyModel({"slm": ModelProfile(Coefficients(0, 0, 0.1, 1.0)),
                        "llm": ModelProfile(Coefficients(0, 0, 0.5, 5.0))})


@pytest.fixture(scope="module")
def models():
    llm, slm = make_pair("llama")
    tok = make_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return llm, slm, tok


def _grader(text: str, answer: str) -> bool:
    return len(text) % 2 == 0


def _train(models, out, steps, grader=_grader, **kw):
    llm, slm, tok = models
    cfg = RouterTrainConfig(out=str(out), steps=steps, batch_prompts=1, group_size=2, threshold=0.1, lam=1e-3,
                            max_new_tokens=4, width=8, num_blocks=1, checkpoint_every=kw.pop("every", 1),
                            device="cpu", progress=False, **kw)
    return train_router(cfg, llm=llm, slm=slm, tokenizer=tok, latency_model=LATENCY, rows=ROWS, grader=grader,
                        log=lambda s: None)


def _steps(out):
    return [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]


class _Payload:
    """Unpickling this runs ``open(marker, "w")``: the code execution a crafted checkpoint attempts."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_crafted_checkpoint_runs_no_code(models, tmp_path):
    marker = tmp_path / "pwned"
    folder = tmp_path / "run" / "checkpoint"
    folder.mkdir(parents=True)
    for name in ("trainer.pt", "trainer_state.pt"):  # the current and the old file name
        with open(folder / name, "wb") as fh:
            pickle.dump({"step": 1, "optimizer": _Payload(marker)}, fh)
    with pytest.raises(ValueError, match="cannot resume|old-format"):
        _train(models, tmp_path / "run", steps=2)
    assert not marker.exists()


def test_checkpoint_is_one_file_loaded_weights_only(models, tmp_path):
    _train(models, tmp_path, steps=1)
    assert sorted(os.listdir(tmp_path / "checkpoint")) == ["trainer.pt"]
    state = torch.load(tmp_path / "checkpoint" / "trainer.pt", weights_only=True)
    assert state["step"] == 1 and "router" in state and "optimizer" in state


def test_kill_during_checkpoint_write_keeps_previous_step(models, tmp_path, monkeypatch):
    at_step1 = _train(models, tmp_path, steps=1).state_dict()

    def killed_mid_write(obj, f, *args, **kwargs):
        if hasattr(f, "write"):
            f.write(b"torn")
        else:
            with open(f, "wb") as fh:
                fh.write(b"torn")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", killed_mid_write)
    with pytest.raises(KeyboardInterrupt):
        _train(models, tmp_path, steps=2)
    monkeypatch.undo()
    resumed = _train(models, tmp_path, steps=1)  # resume at the checkpoint, no step left to run
    for name, value in resumed.state_dict().items():
        assert torch.equal(value, at_step1[name]), name


def test_metrics_do_not_repeat_steps_after_resume(models, tmp_path):
    calls = {"n": 0}

    def dies_in_step_4(text, answer):  # 2 trajectories per step: calls 7-8 are step 4's
        calls["n"] += 1
        if calls["n"] > 6:
            raise KeyboardInterrupt
        return _grader(text, answer)

    with pytest.raises(KeyboardInterrupt):
        _train(models, tmp_path, steps=4, grader=dies_in_step_4, every=2)
    assert _steps(tmp_path) == [1, 2, 3]  # step 3 logged, last checkpoint at step 2
    _train(models, tmp_path, steps=4, every=2)
    assert _steps(tmp_path) == [1, 2, 3, 4]


def test_no_resume_starts_metrics_over(models, tmp_path):
    _train(models, tmp_path, steps=2)
    _train(models, tmp_path, steps=1, resume=False)
    assert _steps(tmp_path) == [1]
