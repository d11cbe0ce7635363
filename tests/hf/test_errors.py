"""Bad input gets a clear error naming the argument and the fix."""

import math

import pytest
import torch
from transformers import StaticCache

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch.hf.compat import with_cache
from tiny_models import make_model, make_pair, make_tokenizer, prompt


@pytest.fixture(scope="module")
def pair():
    return make_pair("llama")


def gen(llm, slm, ids=None, **kw):
    kw.setdefault("stitch_threshold", 0.5)
    return llm.generate(prompt() if ids is None else ids, assistant_model=slm, max_new_tokens=4, **kw)


def test_threshold_without_assistant(pair):
    llm, _ = pair
    with pytest.raises(ValueError, match="assistant_model=slm"):
        llm.generate(prompt(), stitch_threshold=0.1, max_new_tokens=4)


@pytest.mark.parametrize("bad", [-0.1, 1.01, math.nan, math.inf])
def test_threshold_out_of_range(pair, bad):
    with pytest.raises(ValueError, match=r"stitch_threshold.*finite number in \[0, 1\]"):
        gen(*pair, stitch_threshold=bad)


def test_threshold_not_a_number(pair):
    with pytest.raises(TypeError, match="stitch_threshold"):
        gen(*pair, stitch_threshold="0.1")


def test_incompatible_special_ids(pair):
    llm, _ = pair
    other = make_model("llama", 32, 2, seed=5)
    other.generation_config.eos_token_id = 7
    with pytest.raises(ValueError, match="eos_token_id.*incompatible|incompatible.*eos_token_id"):
        gen(llm, other)


def test_different_tokenizers(pair):
    with pytest.raises(ValueError, match="assistant_tokenizer"):
        gen(*pair, tokenizer=make_tokenizer(), assistant_tokenizer=make_tokenizer(80))


def test_beams_and_multiple_returns(pair):
    with pytest.raises(ValueError, match="num_beams=1"):
        gen(*pair, num_beams=2)
    with pytest.raises(ValueError, match="num_return_sequences=1"):
        gen(*pair, num_return_sequences=2, do_sample=True)


def test_unsupported_caches(pair):
    llm, slm = pair
    with pytest.raises(ValueError, match="cache_implementation"):
        gen(llm, slm, cache_implementation="static")
    with pytest.raises(ValueError, match="past_key_values"):
        gen(llm, slm, **with_cache(llm, StaticCache(config=llm.config, max_cache_len=32)))


def test_empty_prompt(pair):
    with pytest.raises(ValueError, match="non-empty prompt"):
        gen(*pair, ids=torch.zeros(1, 0, dtype=torch.long))


def test_assistant_that_is_not_a_model(pair):
    llm, _ = pair
    with pytest.raises(TypeError, match="assistant_model"):
        gen(llm, "small-model")


def test_policy_of_the_wrong_type(pair):
    with pytest.raises(TypeError, match="stitch_policy"):
        gen(*pair, stitch_threshold=None, stitch_policy=lambda h: h > 0.1)


def test_attention_outputs_refused(pair):
    with pytest.raises(ValueError, match="output_attentions"):
        gen(*pair, output_attentions=True, return_dict_in_generate=True)


# ---- issue 47: right padding, and the vocabulary width cut ----------------------------------------------------
def test_right_padding_is_refused_in_one_line_naming_the_fix(pair):
    """Row 2's answer would silently change (its tokens appended after its padding): refused, as one line."""
    llm, slm = pair
    tok = make_tokenizer()
    tok.padding_side = "right"
    batch = tok(["ab c", "a"], return_tensors="pt", padding=True)
    with pytest.raises(ValueError, match='right-padded.*padding_side = "left"') as err:
        gen(llm, slm, batch["input_ids"], attention_mask=batch["attention_mask"])
    assert "\n" not in str(err.value)
    tok.padding_side = "left"
    batch = tok(["ab c", "a"], return_tensors="pt", padding=True)
    gen(llm, slm, batch["input_ids"], attention_mask=batch["attention_mask"])  # the fix it names works


def test_a_vocabulary_width_cut_is_said_once(caplog, monkeypatch):
    import logging

    from hf_rstitch.engine import pair
    from tiny_models import VOCAB

    monkeypatch.setattr(pair, "_WIDTHS_SAID", set())  # once a process: an earlier test may have cut these widths

    llm, slm = make_pair("llama", llm_vocab=VOCAB + 8, seed=3)
    with caplog.at_level(logging.WARNING, logger="hf_rstitch"):
        gen(llm, slm)
        gen(llm, slm)
    said = [r.getMessage() for r in caplog.records if "logits" in r.getMessage()]
    assert len(said) == 1, said
    assert f"LLM emits {VOCAB + 8} logits and the SLM {VOCAB}" in said[0] and f"{VOCAB}..{VOCAB + 7}" in said[0]
