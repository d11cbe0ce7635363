"""MoE experts for decode steps of several rows: one program an expert, so each selected expert is read once.

Why: :mod:`.expert_gemv`'s kernels give each (row, expert) pair its own programs, which read that pair's expert
weights: at 32 rows of Qwen3-30B-A3B that is 256 expert reads a layer (9.4 MB each) where the rows select far
fewer distinct experts -- the floor counts each distinct expert once. Here the grid is the experts
(``E x column blocks``): a program finds the pairs that chose its expert (ids compared on the device, their
order by a prefix sum), returns at once when none did, and otherwise multiplies ``BLOCK_M`` of those pairs'
rows at a time by one tile of its expert's weights (``tl.dot``), so the tile is read once for all of them.

* :func:`gate_up` -- ``silu(W_gate x) * (W_up x)`` of every pair: [T, H] -> [T * top_k, I];
* :func:`down` -- each pair's weighted term ``weights[s] * (W_down[ids[s]] @ act[s])`` -> [T, top_k, H], then
  the sum over ``top_k`` (as :func:`.expert_gemv.down`'s split mode: terms rounded as the eager modules round
  them, the sum in float32).

Same layout, rounding and outputs as :mod:`.expert_gemv`'s kernels (float32 products in IEEE precision, no
TF32), and the grid depends on shapes only: a CUDA graph holds both.

What it does not do: more than ``expert_gemv.MAX_PAIRS`` pairs (the pair list is one block of a program);
one-row steps, where each expert has at most one pair (:mod:`.expert_gemv`'s split kernels fill the GPU better).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from .triton_support import _triton, interpreted, next_pow2


class Launch(NamedTuple):
    """Pairs multiplied together, output columns a program, reduction chunk, warps."""

    block_m: int = 16
    block_n: int = 32
    block_k: int = 128
    warps: int = 4


GATE_UP = Launch(16, 32, 128, 4)  # not yet tuned on a GPU
DOWN = Launch(16, 64, 128, 4)


def gate_up(x: torch.Tensor, gate_up_proj: torch.Tensor, ids: torch.Tensor, launch: Launch = GATE_UP) -> torch.Tensor:
    """``silu(gate) * up`` of every pair: x [T, H], gate_up_proj [E, 2I, H] (gate rows first), ids [T, top_k]
    -> [T * top_k, I] in x's dtype."""
    hidden = x.shape[1]
    experts, inter = gate_up_proj.shape[0], gate_up_proj.shape[1] // 2
    pairs = ids.numel()
    out = torch.empty(pairs, inter, device=x.device, dtype=x.dtype)
    w = gate_up_proj.contiguous()
    _kernels()[0][(experts, -(-inter // launch.block_n))](
        x.contiguous(), w, ids.reshape(-1).contiguous(), out, hidden, inter, ids.shape[-1], pairs, w.stride(0),
        UPCAST=interpreted(), PRECISION=_precision(x), BLOCK_P=max(16, next_pow2(pairs)), BLOCK_M=launch.block_m,
        BLOCK_N=launch.block_n, BLOCK_K=launch.block_k, num_warps=launch.warps)
    return out


def down(act: torch.Tensor, down_proj: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
         launch: Launch = DOWN) -> torch.Tensor:
    """``sum_k weights[t, k] * down_proj[ids[t, k]] @ act[t * top_k + k]``: act [T * top_k, I], down_proj [E, H, I],
    ids / weights [T, top_k] -> [T, H] in act's dtype."""
    tokens, top_k = ids.shape
    experts, hidden, inter = down_proj.shape
    round_terms = weights.dtype == act.dtype  # weights in the hidden dtype: each weighted term is rounded there
    terms = torch.empty(tokens, top_k, hidden, device=act.device, dtype=act.dtype if round_terms else torch.float32)
    w = down_proj.contiguous()
    _kernels()[1][(experts, -(-hidden // launch.block_n))](
        act.contiguous(), w, ids.reshape(-1).contiguous(), weights.reshape(-1).contiguous(), terms, hidden, inter,
        ids.numel(), w.stride(0), ROUND_TERMS=round_terms, UPCAST=interpreted(), PRECISION=_precision(act),
        BLOCK_P=max(16, next_pow2(ids.numel())), BLOCK_M=launch.block_m, BLOCK_N=launch.block_n,
        BLOCK_K=launch.block_k, num_warps=launch.warps)
    return terms.sum(dim=1).to(act.dtype)  # a sum of a low-precision dtype accumulates in float32, as the eager one


def _precision(x: torch.Tensor) -> str:
    """``tl.dot``'s input precision: IEEE for float32 operands (no TF32 rounding), Triton's default otherwise."""
    return "ieee" if x.dtype == torch.float32 else "tf32"


@functools.lru_cache(maxsize=1)
def _kernels():
    triton, tl = _triton()

    @triton.jit
    def _pairs_of(ids_ptr, e, c, P, BLOCK_P: tl.constexpr, BLOCK_M: tl.constexpr):
        # the pairs ranked c .. c + BLOCK_M - 1 among those that chose expert e: (their index, live)
        p = tl.arange(0, BLOCK_P)
        match = tl.load(ids_ptr + p, mask=p < P, other=-1) == e
        rank = tl.cumsum(match.to(tl.int32), axis=0) - 1
        want = c + tl.arange(0, BLOCK_M)
        sel = match[None, :] & (rank[None, :] == want[:, None])  # [BLOCK_M, BLOCK_P]
        return tl.sum(tl.where(sel, p[None, :], 0), axis=1), tl.sum(sel.to(tl.int32), axis=1) > 0

    @triton.jit
    def _count(ids_ptr, e, P, BLOCK_P: tl.constexpr):
        p = tl.arange(0, BLOCK_P)
        return tl.sum((tl.load(ids_ptr + p, mask=p < P, other=-1) == e).to(tl.int32), axis=0)

    @triton.jit
    def _gate_up(x_ptr, w_ptr, ids_ptr, out_ptr, H, I, TOP_K, P, stride_e, UPCAST: tl.constexpr,
                 PRECISION: tl.constexpr, BLOCK_P: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # expert e, BLOCK_N of its I outputs, for every pair that chose it, BLOCK_M pairs at a time
        e = tl.program_id(0)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        kk = tl.arange(0, BLOCK_K)
        count = _count(ids_ptr, e, P, BLOCK_P)
        gate_cols = w_ptr + e.to(tl.int64) * stride_e + n[None, :].to(tl.int64) * H  # [1, BLOCK_N]
        up_cols = gate_cols + I.to(tl.int64) * H
        dtype = out_ptr.dtype.element_ty
        for c in range(0, count, BLOCK_M):
            pair, live = _pairs_of(ids_ptr, e, c, P, BLOCK_P, BLOCK_M)
            x_rows = x_ptr + (pair // TOP_K)[:, None].to(tl.int64) * H  # [BLOCK_M, 1]
            acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, H, BLOCK_K):
                k = k0 + kk
                xk = tl.load(x_rows + k[None, :], mask=live[:, None] & (k[None, :] < H), other=0.0)
                inside = (k[:, None] < H) & (n[None, :] < I)
                wg = tl.load(gate_cols + k[:, None], mask=inside, other=0.0)  # [BLOCK_K, BLOCK_N]
                wu = tl.load(up_cols + k[:, None], mask=inside, other=0.0)
                if UPCAST:  # the interpreter's bfloat16 dot is wrong; a float32 one is exact for these products
                    xk, wg, wu = xk.to(tl.float32), wg.to(tl.float32), wu.to(tl.float32)
                acc_g = tl.dot(xk, wg, acc_g, input_precision=PRECISION)
                acc_u = tl.dot(xk, wu, acc_u, input_precision=PRECISION)
            g = acc_g.to(dtype).to(tl.float32)
            u = acc_u.to(dtype).to(tl.float32)
            silu = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
            tl.store(out_ptr + pair[:, None].to(tl.int64) * I + n[None, :], (silu * u).to(dtype),
                     mask=live[:, None] & (n[None, :] < I))

    @triton.jit
    def _down(a_ptr, w_ptr, ids_ptr, wts_ptr, out_ptr, H, I, P, stride_e, ROUND_TERMS: tl.constexpr,
              UPCAST: tl.constexpr, PRECISION: tl.constexpr,
                 BLOCK_P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # expert e, BLOCK_N of its H outputs: each pair's weighted term, to out[pair] (summed over top_k after)
        e = tl.program_id(0)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        kk = tl.arange(0, BLOCK_K)
        count = _count(ids_ptr, e, P, BLOCK_P)
        cols = w_ptr + e.to(tl.int64) * stride_e + n[None, :].to(tl.int64) * I  # [1, BLOCK_N]
        dtype = a_ptr.dtype.element_ty
        for c in range(0, count, BLOCK_M):
            pair, live = _pairs_of(ids_ptr, e, c, P, BLOCK_P, BLOCK_M)
            a_rows = a_ptr + pair[:, None].to(tl.int64) * I
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, I, BLOCK_K):
                k = k0 + kk
                ak = tl.load(a_rows + k[None, :], mask=live[:, None] & (k[None, :] < I), other=0.0)
                wt = tl.load(cols + k[:, None], mask=(k[:, None] < I) & (n[None, :] < H), other=0.0)
                if UPCAST:
                    ak, wt = ak.to(tl.float32), wt.to(tl.float32)
                acc = tl.dot(ak, wt, acc, input_precision=PRECISION)
            weight = tl.load(wts_ptr + pair, mask=live, other=0.0).to(tl.float32)
            term = acc.to(dtype).to(tl.float32) * weight[:, None]
            if ROUND_TERMS:
                term = term.to(dtype).to(tl.float32)
            tl.store(out_ptr + pair[:, None].to(tl.int64) * H + n[None, :], term.to(out_ptr.dtype.element_ty),
                     mask=live[:, None] & (n[None, :] < H))

    # the kernels resolve triton.language and their helpers in the module's globals (compiled or interpreted)
    globals().update(tl=tl, _count=_count, _pairs_of=_pairs_of)
    return _gate_up, _down
