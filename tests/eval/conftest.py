"""Fixtures for the evaluation tests: a character-level chat tokenizer and tiny random Llama
pairs built in-process (no downloads), plus a small benchmark file."""

from __future__ import annotations

import json

import pytest
import torch

CHARS = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?{}()[]\\$^_+-*/=<>|'\"\n")
SPECIALS = ["<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tokenizer(chat_template: bool = True):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for c in CHARS:
        vocab.setdefault(c, len(vocab))
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<pad>", additional_special_tokens=SPECIALS[3:])
    if chat_template:
        tok.chat_template = CHAT_TEMPLATE
    return tok


def make_model(vocab: int, hidden: int, layers: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.update(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return model


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


@pytest.fixture
def tokenizer_without_template():
    return make_tokenizer(chat_template=False)


@pytest.fixture(scope="session")
def pair(tokenizer):
    """(llm, slm): tiny random Llamas sharing the tokenizer's vocabulary."""
    return make_model(len(tokenizer), 48, 2, seed=0), make_model(len(tokenizer), 32, 1, seed=1)


ROWS = [
    {"id": "a", "problem": "What is 1+1?", "answer": "2"},
    {"id": "b", "problem": "What is 2+3?", "answer": "5"},
    {"id": "c", "problem": "What is 10/4?", "answer": "\\frac{5}{2}"},
]


@pytest.fixture
def bench_file(tmp_path):
    path = tmp_path / "toy.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path
