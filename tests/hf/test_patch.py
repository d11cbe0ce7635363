"""The generate patch survives importlib.reload, removes only itself, and leaves transformers'
warnings pointing at the caller."""

import functools
import importlib
import warnings

import pytest
import torch
from transformers import GenerationMixin

import hf_rstitch
import hf_rstitch.hf.patch as patch_mod
from tiny_models import make_pair, prompt

GREEDY = dict(max_new_tokens=4, do_sample=False)


@pytest.fixture(scope="module")
def pair():
    return make_pair("llama")


@pytest.fixture(autouse=True)
def restore_generate():
    before = GenerationMixin.generate
    yield
    GenerationMixin.generate = before
    hf_rstitch.patch()


def _innermost(fn):
    while getattr(fn, "__wrapped__", None) is not None:
        fn = fn.__wrapped__
    return fn


def _stitched(llm, slm, ids):
    return llm.generate(ids, assistant_model=slm, stitch_threshold=0.3, return_dict_in_generate=True, **GREEDY)


def test_reload_keeps_plain_and_stitched_generate_working(pair):
    llm, slm = pair
    ids = prompt()
    plain, stitched = llm.generate(ids, **GREEDY), _stitched(llm, slm, ids)
    importlib.reload(patch_mod)
    assert patch_mod.is_patched()
    assert torch.equal(llm.generate(ids, **GREEDY), plain)
    patch_mod.patch()  # no second layer, no recursion
    again = _stitched(llm, slm, ids)
    assert torch.equal(again.sequences, stitched.sequences) and again.stitch.n_tokens == 4
    patch_mod.unpatch()
    assert not patch_mod.is_patched()
    assert torch.equal(llm.generate(ids, **GREEDY), plain)
    with pytest.raises(ValueError, match="stitch_threshold"):  # transformers' own generate again
        _stitched(llm, slm, ids)


def test_unpatch_leaves_a_later_wrapper_in_place(pair):
    llm, slm = pair
    ids = prompt()
    below = GenerationMixin.generate
    calls = []

    @functools.wraps(below)
    def other_library(self, *args, **kwargs):
        calls.append(1)
        return below(self, *args, **kwargs)

    GenerationMixin.generate = other_library
    hf_rstitch.unpatch()
    assert GenerationMixin.generate is other_library and not hf_rstitch.is_patched()
    with pytest.raises(ValueError, match="stitch_threshold"):  # the patch passes every call through
        _stitched(llm, slm, ids)
    hf_rstitch.patch()
    assert GenerationMixin.generate is other_library and hf_rstitch.is_patched()
    assert _stitched(llm, slm, ids).stitch.n_tokens == 4
    assert len(calls) == 2


def test_unpatch_restores_transformers_generate():
    hf_rstitch.unpatch()
    assert not hasattr(GenerationMixin.generate, "__rstitch_patch__")
    hf_rstitch.patch()
    hf_rstitch.patch()
    assert _innermost(GenerationMixin.generate).__name__ == "generate"
    hf_rstitch.unpatch()
    hf_rstitch.unpatch()
    assert patch_mod._state_of(GenerationMixin.generate) is None


@pytest.mark.parametrize("stitch", [False, True], ids=["plain", "stitched"])
def test_deprecation_warnings_point_at_the_caller(pair, stitch):
    llm, slm = pair
    extra = dict(assistant_model=slm, stitch_threshold=0.3) if stitch else {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        llm.generate(prompt(), past_key_values=None, **extra, **GREEDY)
    deprecations = [w for w in caught if "past_key_values" in str(w.message)]
    assert deprecations and all(w.filename == __file__ for w in deprecations), \
        [(w.filename, w.lineno) for w in deprecations]


class _Recorder:
    def __init__(self):
        self.chunks, self.ended = [], False

    def put(self, value):
        self.chunks.append(value.reshape(-1).tolist())

    def end(self):
        self.ended = True


@pytest.mark.parametrize("patched", [True, False], ids=["patched", "unpatched"])
def test_custom_generate_streamer_gets_every_token_and_end(pair, patched):
    llm, slm = pair
    ids = prompt()
    if not patched:
        hf_rstitch.unpatch()
    streamer = _Recorder()
    out = llm.generate(ids, custom_generate=hf_rstitch.stitched_decode, stitch_slm=slm, stitch_threshold=0.3,
                       streamer=streamer, **GREEDY)
    assert streamer.ended  # a TextIteratorStreamer's consumer would otherwise wait forever
    assert streamer.chunks[0] == ids[0].tolist()
    assert sum(streamer.chunks[1:], []) == out[0, ids.shape[1]:].tolist()
