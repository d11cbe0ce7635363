"""KV memory sizing (hf_rstitch.fast.kv_memory): bytes a token from what the layers store, tokens from free memory,
and the numbers docs/serving.md gives for Qwen2-7B / 1.5B in bfloat16."""

import pytest
import torch

from hf_rstitch.fast.kv_memory import kv_bytes_per_token, kv_tokens_for
from tiny_models import make_pair

QWEN2_7B = 2 * 28 * 4 * 128 * 2  # layers x KV heads x head size, keys and values, bf16
QWEN2_1_5B = 2 * 28 * 2 * 128 * 2
H100, H200 = 85_017_624_576, 150_754_820_096  # bytes torch.cuda.mem_get_info reports as total
PAIR_LOADED = 19_900_000_000  # the pair's weights, the fused q/k/v copies and the CUDA context


def test_bytes_a_token_come_from_the_layers():
    llm, _ = make_pair("qwen2-full")
    cfg = llm.config
    dim = cfg.hidden_size // cfg.num_attention_heads
    assert kv_bytes_per_token(llm) == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * dim * llm.dtype.itemsize
    assert kv_bytes_per_token(llm.to(torch.bfloat16)) * 4 == kv_bytes_per_token(llm.to(torch.float64))


def test_qwen2_pair_on_h100_and_h200():
    assert QWEN2_7B + QWEN2_1_5B == 86_016
    h100 = kv_tokens_for([QWEN2_7B, QWEN2_1_5B], H100 - PAIR_LOADED, H100, fraction=0.9)
    h200 = kv_tokens_for([QWEN2_7B, QWEN2_1_5B], H200 - PAIR_LOADED, H200, fraction=0.9)
    assert h100 == 658_192 and h100 // 32768 == 20 and h100 // 64 > 10_000
    assert h200 == 1_346_016 and h200 // 32768 == 41 and h200 // 64 > 21_000
    assert h100 % 16 == 0 and h200 % 16 == 0  # whole blocks


def test_nothing_left_is_zero_and_bad_fractions_are_refused():
    assert kv_tokens_for([100], free_bytes=10, total_bytes=1000, fraction=0.9) == 0
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\]"):
        kv_tokens_for([100], 10, 1000, fraction=0)
