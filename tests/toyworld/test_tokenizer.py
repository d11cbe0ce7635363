"""Shared tokenizer: lossless round trip, chat template, special tokens, AutoTokenizer loading."""

import pytest

from hf_rstitch.toyworld import tasks
from hf_rstitch.toyworld.pair import assets_present
from hf_rstitch.toyworld.tokenizer import ASSISTANT, EOS, SPECIAL_TOKENS, USER, build_default_tokenizer, prompt_text


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
    ids = tok(" is \\boxed{305}", add_special_tokens=False)["input_ids"]
    assert [tok.decode([i]) for i in ids] == [" is", " \\", "boxed", "{", "3", "0", "5", "}"]
    assert tok.convert_ids_to_tokens(ids)[0] == "\u0120is"  # stored byte-level (GPT-2's alphabet)


@pytest.mark.skipif(not assets_present(), reason="the shipped pair is not in this checkout")
def test_the_shipped_tokenizer_is_the_built_one_token_for_token(tok):
    """Regenerating the asset keeps every id: the shipped files equal the built tokenizer, whose token i is piece i
    of build_vocab (its pieces come first, in order, before any other), and the two encode alike."""
    from transformers import AutoTokenizer

    from hf_rstitch import shipped

    pieces = [tok.decode([i]) for i in range(len(tok))]
    assert pieces[:len(SPECIAL_TOKENS) + 10] == SPECIAL_TOKENS + [str(d) for d in range(10)]
    for role in ("llm", "slm"):
        asset = AutoTokenizer.from_pretrained(shipped(role))
        assert asset.get_vocab() == tok.get_vocab()
        assert [asset.decode([i]) for i in range(len(asset))] == pieces
    row = tasks.make_split("test", 1, seed=5)[0]
    assert asset(row["problem"])["input_ids"] == tok(row["problem"])["input_ids"]


@pytest.mark.skipif(not assets_present(), reason="the shipped pair is not in this checkout")
def test_stop_string_criteria_read_the_shipped_vocabulary():
    from transformers import AutoTokenizer, StopStringCriteria

    from hf_rstitch import shipped

    tok = AutoTokenizer.from_pretrained(shipped("llm"))
    ids = tok(" 84.", add_special_tokens=False, return_tensors="pt")["input_ids"]
    stop = StopStringCriteria(tokenizer=tok, stop_strings=["84."])
    assert stop(ids, None).tolist() == [True] and stop(ids[:, :-1], None).tolist() == [False]


@pytest.mark.skipif(not assets_present(), reason="the shipped pair is not in this checkout")
@pytest.mark.slow  # 3.9 s on 2 cores (pytest --durations)
def test_stop_strings_work_on_the_shipped_pair_plain_and_stitched():
    """transformers' StopStringCriteria reads each token's text from the vocabulary (byte-level here)."""
    import torch
    from transformers import StopStringCriteria

    from hf_rstitch.toyworld.pair import load_pair

    llm, slm, tok = load_pair("cpu")
    StopStringCriteria(tokenizer=tok, stop_strings=["84."])
    ids = tok.apply_chat_template([{"role": "user", "content": tasks.make_split("test", 1, seed=2)[0]["problem"]}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    n = ids["input_ids"].shape[1]
    free = llm.generate(**ids, max_new_tokens=12, do_sample=False)[0, n:]
    stop = tok.decode(free[4:6])  # two whole tokens: generation ends after the sixth
    for extra in ({}, {"assistant_model": slm, "stitch_threshold": 0.0}):  # tau 0: the LLM alone, stitched
        with torch.inference_mode():
            out = llm.generate(**ids, max_new_tokens=12, do_sample=False, stop_strings=[stop], tokenizer=tok, **extra)
        assert out[0, n:].tolist() == free[:6].tolist(), (stop, tok.decode(out[0, n:]))


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
