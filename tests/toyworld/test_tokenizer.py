"""Shared tokenizer: lossless round trip, chat template, special tokens, AutoTokenizer loading."""

import pytest

from hf_rstitch.toyworld import tasks
from hf_rstitch.toyworld.tokenizer import ASSISTANT, EOS, USER, build_default_tokenizer, prompt_text


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("tok")
    build_default_tokenizer().save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def test_round_trip_without_unknowns(tok):
    for style in tasks.STYLES:
        for row in tasks.make_split("test", 100, seed=1, style=style):
            for text in (row["problem"], row["reasoning"]):
                ids = tok(text, add_special_tokens=False)["input_ids"]
                assert tok.unk_token_id not in ids
                assert tok.decode(ids) == text


def test_digits_are_single_tokens(tok):
    pieces = tok.convert_ids_to_tokens(tok(" is \\boxed{305}", add_special_tokens=False)["input_ids"])
    assert pieces == [" is", " \\", "boxed", "{", "3", "0", "5", "}"]


def test_special_tokens_and_chat_template(tok):
    assert tok.eos_token == EOS and tok.pad_token is not None and tok.pad_token_id != tok.eos_token_id
    assert len(tok) < 200
    prompt = prompt_text(tok, "Tom has 3 apples.")
    assert prompt == f"{USER}Tom has 3 apples.{EOS}{ASSISTANT}"
    full = tok.apply_chat_template([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}],
                                   tokenize=False)
    assert full == f"{USER}Q{EOS}{ASSISTANT}A{EOS}"
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids(USER) and ids[-1] == tok.convert_tokens_to_ids(ASSISTANT)
