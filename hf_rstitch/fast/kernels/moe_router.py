"""An MoE router's decode step as two Triton kernels: gate logits, then softmax -> top-k -> renormalize.

Why: the routers of Qwen3-MoE and Mixtral (``F.linear``, ``softmax``, ``topk``, a sum and a division, a cast)
run six to eight small PyTorch kernels a layer; at one row of Qwen3-30B-A3B they cost about as much as the
experts' own products (``benchmarks/results/engine_batched_qwen3_moe_*``). Here:

* :func:`logits` -- ``x @ W.T`` ([T, H] x [E, H] -> [T, E]), rounded to the model's dtype as ``F.linear``'s
  output is; one program a row and ``block_e`` experts;
* :func:`select` -- per row: softmax in float32, the ``top_k`` largest probabilities (descending, ties to the
  lower expert id), divided by their sum where the router renormalizes, cast to the dtype the router returns;
  ids as int64, as ``torch.topk`` gives them. One program a row.

Nothing leaves the device and the grids depend on shapes only: a CUDA graph holds both. The ids and weights
feed :mod:`.expert_gemv` (or any of transformers' experts implementations) unchanged.

What it does not do: routers with biases, grouped or sigmoid scoring (DeepSeek-V3, gpt-oss's bias), jitter
noise; float64 (Triton's float32 arithmetic). Which routers may run it is decided by
:mod:`hf_rstitch.fast.patches.routers`.
"""

from __future__ import annotations

import functools

import torch

from .triton_support import _triton, available, next_pow2

__all__ = ["available", "logits", "route", "select"]
BLOCK_E = 4  # experts a program of the logits kernel owns: 32 programs a row for 128 experts
BLOCK_K = 512  # hidden columns a step of its reduction


def logits(x: torch.Tensor, weight: torch.Tensor, block_e: int = BLOCK_E, block_k: int = BLOCK_K) -> torch.Tensor:
    """``F.linear(x, weight)`` for x [T, H], weight [E, H] -> [T, E] in x's dtype (sums in float32)."""
    tokens, hidden = x.shape
    experts = weight.shape[0]
    out = torch.empty(tokens, experts, device=x.device, dtype=x.dtype)
    w = weight.contiguous()
    _kernels()[0][(tokens, -(-experts // block_e))](x.contiguous(), w, out, hidden, experts,
                                                    BLOCK_E=block_e, BLOCK_K=block_k, num_warps=4)
    return out


def select(router_logits: torch.Tensor, top_k: int, normalize: bool,
           dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights [T, top_k] in dtype, ids [T, top_k] int64)`` of ``router_logits`` [T, E]: the ``top_k``
    largest softmax probabilities (float32), divided by their sum when ``normalize``."""
    tokens, experts = router_logits.shape
    weights = torch.empty(tokens, top_k, device=router_logits.device, dtype=dtype)
    ids = torch.empty(tokens, top_k, device=router_logits.device, dtype=torch.long)
    _kernels()[1][(tokens,)](router_logits.contiguous(), weights, ids, experts, TOP_K=top_k, NORMALIZE=normalize,
                             BLOCK_E=next_pow2(experts), BLOCK_TOP=next_pow2(top_k), num_warps=1)
    return weights, ids


def route(x: torch.Tensor, weight: torch.Tensor, top_k: int, normalize: bool, dtype: torch.dtype | None = None):
    """``(logits, weights, ids)`` as a Qwen3-MoE / Mixtral router returns them (``dtype``: the weights'; None:
    x's)."""
    out = logits(x, weight)
    weights, ids = select(out, top_k, normalize, dtype or x.dtype)
    return out, weights, ids


@functools.lru_cache(maxsize=1)
def _kernels():
    triton, tl = _triton()

    @triton.jit
    def _logits(x_ptr, w_ptr, out_ptr, H, E, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
        # row t, experts e: sum_k W[e, k] x[t, k] in float32, rounded to the dtype
        t = tl.program_id(0).to(tl.int64)
        e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
        cols = tl.arange(0, BLOCK_K)
        rows = w_ptr + e[:, None].to(tl.int64) * H
        acc = tl.zeros((BLOCK_E, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            k = k0 + cols
            xk = tl.load(x_ptr + t * H + k, mask=k < H, other=0.0).to(tl.float32)[None, :]
            inside = (e[:, None] < E) & (k[None, :] < H)
            acc += tl.load(rows + k[None, :], mask=inside, other=0.0).to(tl.float32) * xk
        tl.store(out_ptr + t * E + e, tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty), mask=e < E)

    @triton.jit
    def _select(l_ptr, wts_ptr, ids_ptr, E, TOP_K: tl.constexpr, NORMALIZE: tl.constexpr,
                BLOCK_E: tl.constexpr, BLOCK_TOP: tl.constexpr):
        # row t: p = softmax(logits) in float32; the TOP_K largest (descending, ties to the lower id); / their sum
        t = tl.program_id(0).to(tl.int64)
        e = tl.arange(0, BLOCK_E)
        inside = e < E
        x = tl.load(l_ptr + t * E + e, mask=inside, other=float("-inf")).to(tl.float32)
        p = tl.exp(x - tl.max(x, axis=0))
        p = tl.where(inside, p, 0.0)
        p = p / tl.sum(p, axis=0)
        left = tl.where(inside, p, -1.0)  # probabilities are >= 0: -1 marks padding and experts taken
        slot = tl.arange(0, BLOCK_TOP)
        vals = tl.zeros((BLOCK_TOP,), dtype=tl.float32)
        ids = tl.zeros((BLOCK_TOP,), dtype=tl.int64)
        for j in tl.static_range(TOP_K):
            best = tl.max(left, axis=0)
            which = tl.min(tl.where(left == best, e, BLOCK_E), axis=0)
            vals = tl.where(slot == j, best, vals)
            ids = tl.where(slot == j, which.to(tl.int64), ids)
            left = tl.where(e == which, -1.0, left)
        if NORMALIZE:
            vals = vals / tl.sum(tl.where(slot < TOP_K, vals, 0.0), axis=0)
        tl.store(wts_ptr + t * TOP_K + slot, vals.to(wts_ptr.dtype.element_ty), mask=slot < TOP_K)
        tl.store(ids_ptr + t * TOP_K + slot, ids, mask=slot < TOP_K)

    globals()["tl"] = tl  # the interpreter resolves triton.language in the kernels' module globals
    return _logits, _select
