"""The paged addressing of the split attention and the cache-store kernels (hf_rstitch.fast.paged_kv): the same
outputs and cache contents as the static layout they replace, for rows at different lengths, odd lengths and
block boundaries.

On CPU the kernels run only under Triton's interpreter (``TRITON_INTERPRET=1``); these tests skip when it is
not there. On CUDA they run compiled.
"""

import pytest
import torch

from hf_rstitch.fast.kernels import decode_attention as da
from hf_rstitch.fast.kernels import gemv, rope_store
from hf_rstitch.fast.blocks import TRASH

from .kernels.test_decode_attention import reference

DEVICES = [d for d, ok in (("cpu", gemv.available("cpu")),
                           ("cuda", torch.cuda.is_available() and gemv.available("cuda"))) if ok]
pytestmark = pytest.mark.skipif(not DEVICES, reason="needs triton (CUDA, or TRITON_INTERPRET=1 on CPU)")


def paged(key: torch.Tensor, pads: list[int], written: int, block: int, spare: int = 3, seed: int = 0):
    """``key`` ``[b, H, S, D]`` (static layout) as a pool ``[blocks, H, block, D]`` and a table ``[b, width]``:
    each row's tokens (slots from its padding up to ``written``) in blocks handed out in a shuffled order; the
    trash block holds finite junk, unassigned blocks NaN (never read)."""
    batch, heads, slots, dim = key.shape
    width = -(-slots // block)
    need = [-(-(written - p) // block) for p in pads]
    n_blocks = 1 + sum(need) + spare
    order = torch.randperm(n_blocks - 1, generator=torch.Generator().manual_seed(seed)) + 1
    pool = torch.full((n_blocks, heads, block, dim), float("nan"), dtype=key.dtype, device=key.device)
    pool[TRASH] = torch.randn(heads, block, dim, generator=torch.Generator().manual_seed(seed + 1)).to(key)
    table = torch.full((batch, width), TRASH, dtype=torch.int32)
    taken = iter(order.tolist())
    for b, p in enumerate(pads):
        for t in range(need[b]):
            blk = next(taken)
            table[b, t] = blk
            part = key[b, :, p + t * block: min(p + (t + 1) * block, written)]
            pool[blk, :, : part.shape[1]] = part
    return pool, table.to(key.device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch,heads,kv_heads,q,dim,slots,pos,pads,block", [
    (1, 8, 2, 1, 32, 512, 37, [0], 16),  # B = 1 decode step, odd length
    (3, 7, 1, 1, 16, 320, 200, [0, 5, 199], 16),  # rows at very different lengths (one holds 2 tokens)
    (4, 12, 2, 2, 64, 256, 64, [3, 0, 0, 60], 16),  # two-token catch-up ending on a block boundary
    (2, 4, 4, 13, 16, 640, 511, [0, 7], 32),  # a padded bucket crossing many splits and blocks
    (2, 8, 2, 8, 32, 448, 95, [16, 1], 16),  # a row whose padding fills whole blocks
])
def test_paged_kernel_equals_reference_and_static(device, batch, heads, kv_heads, q, dim, slots, pos, pads, block):
    torch.manual_seed(batch + q + pos)
    query = torch.randn(batch, q, heads, dim, device=device).transpose(1, 2)
    key = torch.randn(batch, kv_heads, slots, dim, device=device)
    value = torch.randn(batch, kv_heads, slots, dim, device=device)
    key[:, :, pos + q:] = float("nan")
    value[:, :, pos + q:] = float("nan")
    posd, pad = torch.tensor(pos, device=device), torch.tensor(pads, device=device)
    k_pool, table = paged(key, pads, pos + q, block)
    v_pool, _ = paged(value, pads, pos + q, block)
    got, _ = da.decode_attention(None, query, k_pool, v_pool, None, scaling=0.3, pos=posd, pad=pad, fallback=None,
                                 table=table)
    static, _ = da.decode_attention(None, query, key, value, None, scaling=0.3, pos=posd, pad=pad, fallback=None)
    torch.testing.assert_close(got.double(), reference(query, key, value, pos, pads, 0.3), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(got, static, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("one_split,in_split", [(True, False), (False, False), (False, True)])
def test_paged_kernel_one_split_and_many(device, one_split, in_split, monkeypatch):
    """Both plans (the split kernel writing the output itself, and splits combined, by a kernel of their own or in
    the split kernel's last program: ``COMBINE_IN_SPLIT``) read the blocks alike."""
    monkeypatch.setattr(da, "COMBINE_IN_SPLIT", in_split)
    monkeypatch.setattr(da, "_sm_count", lambda device: 4 if one_split else 132)
    monkeypatch.setattr(da, "ONE_SPLIT", 1.0 if one_split else 99.0)
    batch, heads, kv_heads, q, dim, slots, pos, pads = 3, 6, 2, 1, 16, 1024, 700, [0, 33, 690]
    torch.manual_seed(7)
    query = torch.randn(batch, q, heads, dim, device=device).transpose(1, 2)
    key, value = (torch.randn(batch, kv_heads, slots, dim, device=device) for _ in range(2))
    k_pool, table = paged(key, pads, pos + q, 16)
    v_pool, _ = paged(value, pads, pos + q, 16)
    got, _ = da.decode_attention(None, query, k_pool, v_pool, None, scaling=0.25, pos=torch.tensor(pos, device=device),
                                 pad=torch.tensor(pads, device=device), fallback=None, table=table)
    torch.testing.assert_close(got.double(), reference(query, key, value, pos, pads, 0.25), atol=2e-5, rtol=2e-5)


def _store_case(device, b, s, pads, pos, block=4, slots=24, heads=2, dim=16):
    torch.manual_seed(b + s + pos)
    k, v = (torch.randn(b, heads, s, dim, device=device) for _ in range(2))
    width = -(-slots // block)
    n_blocks = 1 + b * width
    table = torch.full((b, width), TRASH, dtype=torch.int32, device=device)
    perm = (torch.randperm(n_blocks - 1) + 1).tolist()
    for r, p in enumerate(pads):  # blocks for every token the slots write (none left of the padding)
        for t in range(-(-(pos + s - p) // block)):
            table[r, t] = perm.pop()
    pool_k, pool_v = (torch.zeros(n_blocks, heads, block, dim, device=device) for _ in range(2))
    slots_t = torch.arange(pos, pos + s, device=device)
    return k, v, slots_t, table, torch.tensor(pads, device=device), pool_k, pool_v


def _read(pool, table, pads, row, slot, block):
    t = slot - pads[row]
    return pool[table[row, t // block], :, t % block] if t >= 0 else None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b,s,pads,pos", [(1, 1, [0], 5), (2, 3, [0, 2], 3), (3, 5, [0, 6, 1], 2)])
def test_paged_store_kv_writes_each_token_into_its_block(device, b, s, pads, pos):
    k, v, slots, table, pad, pool_k, pool_v = _store_case(device, b, s, pads, pos)
    rope_store.store_kv(k, v, slots, pool_k, pool_v, table, pad)
    for r in range(b):
        for i, slot in enumerate(slots.tolist()):
            got_k, got_v = _read(pool_k, table, pads, r, slot, 4), _read(pool_v, table, pads, r, slot, 4)
            if got_k is None:  # left of the row's padding: the trash block, nothing of the row's touched
                continue
            assert torch.equal(got_k, k[r, :, i]) and torch.equal(got_v, v[r, :, i])
    owned = table[table != TRASH].long()
    assert sorted(owned.tolist()) == sorted(set(owned.tolist()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b,s,pads,pos", [(1, 1, [0], 5), (3, 5, [0, 6, 1], 2)])
def test_paged_rope_store_equals_rotate_then_store(device, b, s, pads, pos):
    k, v, slots, table, pad, pool_k, pool_v = _store_case(device, b, s, pads, pos)
    q = torch.randn(b, 4, s, 16, device=device)
    angle = torch.randn(b, s, 8, device=device)
    cos, sin = (torch.cat([f(angle), f(angle)], dim=-1) for f in (torch.cos, torch.sin))
    want_q, want_k = rope_store.rotate_qk(q, k, cos, sin)
    q_out = torch.empty_like(q)
    rope_store.rope_store(q, k, v, cos, sin, slots, q_out, pool_k, pool_v, table, pad)
    assert torch.equal(q_out, want_q)
    want_pk, want_pv = (torch.zeros_like(pool_k) for _ in range(2))
    rope_store.store_kv(want_k, v, slots, want_pk, want_pv, table, pad)
    real = table[table != TRASH].long()
    assert torch.equal(pool_k[real], want_pk[real]) and torch.equal(pool_v[real], want_pv[real])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b,s,pads,pos", [(1, 1, [0], 5), (3, 5, [0, 6, 1], 2)])
def test_paged_rope_store_with_norms_equals_norm_then_rotate_then_store(device, b, s, pads, pos):
    # Qwen3's per-head q/k RMSNorms folded into the rotation (NORM) write into a paged pool as into a static cache
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    k, v, slots, table, pad, pool_k, pool_v = _store_case(device, b, s, pads, pos)
    q = torch.randn(b, 4, s, 16, device=device)
    angle = torch.randn(b, s, 8, device=device)
    cos, sin = (torch.cat([f(angle), f(angle)], dim=-1) for f in (torch.cos, torch.sin))
    q_norm, k_norm = (LlamaRMSNorm(16, eps=1e-6).to(device) for _ in range(2))
    with torch.no_grad():
        q_norm.weight.uniform_(0.5, 1.5)
        k_norm.weight.uniform_(0.5, 1.5)
        want_q, want_k = rope_store.rotate_qk(q_norm(q), k_norm(k), cos, sin)
        q_out = torch.empty_like(q)
        rope_store.rope_store(q, k, v, cos, sin, slots, q_out, pool_k, pool_v, table, pad, q_norm.weight,
                              k_norm.weight, 1e-6)
    torch.testing.assert_close(q_out, want_q, atol=1e-6, rtol=1e-6)
    want_pk, want_pv = (torch.zeros_like(pool_k) for _ in range(2))
    rope_store.store_kv(want_k, v, slots, want_pk, want_pv, table, pad)
    real = table[table != TRASH].long()
    torch.testing.assert_close(pool_k[real], want_pk[real], atol=1e-6, rtol=1e-6)
    assert torch.equal(pool_v[real], want_pv[real])
