"""Training pieces: loss masks, LR schedule, checkpoint selection, a tiny CPU smoke run."""

import math

import pytest
import torch

from hf_rstitch.toyworld import tasks
from hf_rstitch.toyworld.tokenizer import build_default_tokenizer
from hf_rstitch.toyworld.train import TrainConfig, _select, encode_rows, lr_factor, train


@pytest.fixture(scope="module")
def tok():
    return build_default_tokenizer()


def test_loss_only_on_assistant_part_and_own_style_opening(tok):
    rows = tasks.make_split("train", 2, seed=0, style="concise") + \
        tasks.make_split("train", 2, seed=0, style="verbose")
    for row, (ids, labels) in zip(rows, encode_rows(tok, rows, own_style="verbose")):
        n_prompt = ids.index(tok.convert_tokens_to_ids("<|assistant|>")) + 1
        assert all(label == -100 for label in labels[:n_prompt])
        assert labels[-1] == tok.eos_token_id
        assert labels[n_prompt + 1:] == ids[n_prompt + 1:]
        # The style's opening word is learned for the own style only.
        assert (labels[n_prompt] == -100) == (row["style"] == "concise")


def test_lr_schedule_hand_values():
    assert lr_factor(0.0, 0, warmup_steps=10) == pytest.approx(0.1)
    assert lr_factor(0.0, 10, warmup_steps=10) == pytest.approx(1.0)
    assert lr_factor(0.5, 500, warmup_steps=10) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_factor(1.0, 999, warmup_steps=10) == pytest.approx(0.1)
    assert math.isclose(lr_factor(2.0, 999, 10), 0.1)


def test_checkpoint_selection_respects_weak_model_cap():
    assert _select(None, 0.5, cap=0.7)
    assert not _select(None, 0.8, cap=0.7)
    assert not _select({"accuracy": 0.6}, 0.75, cap=0.7)
    assert _select({"accuracy": 0.6}, 0.65, cap=0.7)
    assert _select({"accuracy": 0.6}, 0.95, cap=0.0)


def test_config_validation_says_what_is_wrong():
    with pytest.raises(ValueError, match="preset must be one of"):
        TrainConfig(preset="huge")
    with pytest.raises(ValueError, match="divisible by num_heads"):
        TrainConfig(preset="tiny", hidden_size=33)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_cpu_training_smoke(tmp_path, tok, arch):
    from transformers import AutoModelForCausalLM

    cfg = TrainConfig(preset="tiny", arch=arch, out=str(tmp_path / arch), steps=3, eval_every=3,
                      n_valid=2, max_new_tokens=4, device="cpu", log_every=1)
    lines = []
    summary = train(cfg, tokenizer=tok, log=lines.append)
    assert summary["steps"] == 3 and summary["history"][-1]["step"] == 3
    assert any("loss" in line for line in lines)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / arch)
    assert model.dtype == torch.float32  # stored float16, loads float32 by default
    assert (tmp_path / arch / "model.safetensors").exists()
    assert (tmp_path / arch / "tokenizer.json").exists()
