"""Training pieces: loss masks, LR schedule, checkpoint selection, a tiny CPU smoke run."""

import math

import pytest
import torch

from hf_rstitch.toyworld import tasks
from hf_rstitch.toyworld.tokenizer import build_default_tokenizer
from hf_rstitch.toyworld.train import (TrainConfig, _select, build_model, collate, encode_rows,
                                       lr_factor, step_loss, style_parts, train)


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


def test_selection_on_both_styles_scores_their_sum():
    best = {"accuracy": 1.0, "other_accuracy": 0.90}
    assert _select(best, 0.99, cap=0.0, other_acc=0.95)      # 1.94 beats 1.90
    assert not _select(best, 1.0, cap=0.0, other_acc=0.85)
    assert not _select(best, 0.8, cap=0.7, other_acc=1.0)    # the cap still applies to own style


def test_style_parts_give_the_mixed_batch_loss(tok):
    """Padding each style separately changes nothing but the padding: same token-mean loss and
    gradient as one mixed batch (float64 weights; transformers' loss runs in float32, which sets
    the tolerance)."""
    rows = tasks.make_split("train", 3, seed=0, style="concise") + \
        tasks.make_split("train", 2, seed=0, style="verbose")
    pairs = encode_rows(tok, rows, own_style="verbose")
    parts = style_parts(pairs, [r["style"] for r in rows], tok.pad_token_id)
    assert [p["input_ids"].shape[0] for p in parts] == [3, 2]
    assert parts[0]["input_ids"].shape[1] < parts[1]["input_ids"].shape[1]
    torch.manual_seed(0)
    model = build_model(TrainConfig(preset="tiny"), tok).double()
    loss_parts = step_loss(model, parts, "cpu")
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    mixed = model(**collate(pairs, tok.pad_token_id)).loss
    mixed.backward()
    assert loss_parts == pytest.approx(mixed.item(), rel=1e-6)
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-7)


def test_opening_words_and_opened_evaluation(tok):
    from hf_rstitch.toyworld.evaluate import generate_batch

    assert (tasks.opening_word("concise"), tasks.opening_word("verbose")) == ("So", "Let")
    model = build_model(TrainConfig(preset="tiny"), tok).eval()
    texts, lengths = generate_batch(model, tok, ["Tom has 3 pens."], max_new_tokens=3, opener="So")
    assert len(texts) == 1 and lengths[0] <= 3


def test_init_from_continues_a_saved_model(tmp_path, tok):
    first = TrainConfig(preset="tiny", out=str(tmp_path / "a"), steps=1, eval_every=1, n_valid=1,
                        max_new_tokens=2, device="cpu", eval_other_style=False)
    train(first, tokenizer=tok, log=lambda line: None)
    second = TrainConfig(preset="tiny", hidden_size=64, init_from=first.out, out=str(tmp_path / "b"),
                         steps=1, eval_every=1, n_valid=1, max_new_tokens=2, device="cpu")
    summary = train(second, tokenizer=tok, log=lambda line: None)
    assert summary["config"]["hidden_size"] == 32  # the saved model's shape, not the override
    assert "other_accuracy" in summary["history"][-1]
    with pytest.raises(FileNotFoundError, match="not a saved model folder"):
        build_model(TrainConfig(preset="tiny", init_from=str(tmp_path / "none")), tok)


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
