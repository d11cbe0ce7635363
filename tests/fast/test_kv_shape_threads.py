"""Concurrent first calls: the KV-shape probe (:func:`hf_rstitch.fast.kv_shapes.kv_shape`) swaps a model's attention
for one forward; threads that reach it at once must each get the model's shape, leave the model's attention as it
was, and, through ``generate``, each get the tokens a call alone gets."""

import concurrent.futures
import threading

import pytest
import torch
from tiny_models import make_pair, prompt

from hf_rstitch.fast.kv_shapes import ATTRIBUTE, kv_shape

THREADS = 4


def _at_once(fn, args):
    """``fn(arg)`` for every arg, each in its own thread, released together."""
    start = threading.Barrier(len(args))

    def call(arg):
        start.wait()
        return fn(arg)

    with concurrent.futures.ThreadPoolExecutor(len(args)) as pool:
        return list(pool.map(call, args))


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_threads_probing_one_fresh_model_at_once_each_get_its_shape(arch):
    for seed in range(3):  # fresh models: each is probed anew
        llm, _ = make_pair(arch, seed)
        before = llm.config._attn_implementation
        shapes = _at_once(kv_shape, [llm] * THREADS)
        assert llm.config._attn_implementation == before
        want = shapes[0]
        del llm.__dict__[ATTRIBUTE]  # probe again, alone
        assert shapes == [kv_shape(llm)] * THREADS == [want] * THREADS


def _stitched(llm, slm, ids):
    return llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=slm, stitch_threshold=0.5,
                        max_new_tokens=12, do_sample=False)


def test_first_generate_calls_at_once_each_equal_a_call_alone():
    llm, slm = make_pair("llama", seed=5)
    prompts = [prompt(9, seed=s) for s in range(THREADS)]
    got = _at_once(lambda ids: _stitched(llm, slm, ids), prompts)  # the pair's first calls
    for ids, out in zip(prompts, got):
        assert torch.equal(out, _stitched(llm, slm, ids))
