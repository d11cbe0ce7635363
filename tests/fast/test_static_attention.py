"""static_attention (the fast engine's attention) against a plain reference: KV heads repeated,
masked softmax, one matrix product -- with and without the chunked weighted sum."""

import pytest
import torch

from hf_rstitch.fast.static_kv import KV_CHUNK, _weighted_values, static_attention, static_attention_sdpa


def reference(query, key, value, mask, scale):
    group = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(group, dim=1)
    value = value.repeat_interleave(group, dim=1)
    scores = (query @ key.transpose(2, 3)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ value).transpose(1, 2)  # [1, q, H, D]


@pytest.mark.parametrize("attention", [static_attention, static_attention_sdpa])
@pytest.mark.parametrize("slots", [64, 2 * KV_CHUNK, 4 * KV_CHUNK, 3 * KV_CHUNK + 64])
@pytest.mark.parametrize("heads,kv_heads,q", [(4, 4, 1), (6, 2, 1), (6, 2, 5), (8, 1, 3)])
def test_static_attention_equals_reference(attention, slots, heads, kv_heads, q):
    torch.manual_seed(slots + 10 * heads + q)
    dim = 16
    query = torch.randn(1, heads, q, dim, dtype=torch.float64)
    key = torch.randn(1, kv_heads, slots, dim, dtype=torch.float64)
    value = torch.randn(1, kv_heads, slots, dim, dtype=torch.float64)
    pos = slots // 2  # queries sit at slots pos .. pos + q - 1, causal, first 3 slots are padding
    slot = torch.arange(slots)
    mine = pos + torch.arange(q)
    mask = (slot[None, :] <= mine[:, None]) & ((slot[None, :] >= 3) | (slot[None, :] == mine[:, None]))
    mask = mask[None, None]
    out, weights = attention(None, query, key, value, mask, scaling=0.3)
    assert weights is None
    assert out.shape == (1, q, heads, dim)
    torch.testing.assert_close(out, reference(query, key, value, mask, 0.3), rtol=1e-10, atol=1e-10)


def test_weighted_values_splits_only_whole_chunks():
    probs = torch.rand(1, 2, 3, 2 * KV_CHUNK, dtype=torch.float64)
    value = torch.randn(1, 2, 2 * KV_CHUNK, 8, dtype=torch.float64)
    torch.testing.assert_close(_weighted_values(probs, value), probs @ value)
    odd = torch.rand(1, 2, 3, KV_CHUNK + 1, dtype=torch.float64)
    torch.testing.assert_close(_weighted_values(odd, value[:, :, : KV_CHUNK + 1]), odd @ value[:, :, : KV_CHUNK + 1])


def test_default_scale_is_inverse_sqrt_of_head_dim():
    query = torch.randn(1, 2, 1, 4, dtype=torch.float64)
    key = torch.randn(1, 2, 8, 4, dtype=torch.float64)
    value = torch.randn(1, 2, 8, 4, dtype=torch.float64)
    mask = torch.ones(1, 1, 1, 8, dtype=torch.bool)
    out, _ = static_attention(None, query, key, value, mask)
    torch.testing.assert_close(out, reference(query, key, value, mask, 0.5))
