"""The gated MLP's two products and its activation in one kernel: ``silu(x @ Wg^T) * (x @ Wu^T)``.

Why: a decode step of a Llama/Qwen2-style MLP ran three kernels before its down projection -- the
gate GEMV, the up GEMV and the SiLU product (fused by ``compile="parts"``, three more without it)
-- each a launch and a ramp to full bandwidth, 28 times a token for Qwen2. Here one program reads
a block of rows of *both* weights (no concatenated copy of the weights is made) and writes the
activated product, so the MLP is two kernels: this one and the down projection.

Same arithmetic as the module's eager forward: each product accumulates in float32 and is rounded
to the model's dtype, the SiLU is rounded, then the product is rounded.

Inputs of several rows take the tiers of :mod:`.gemv` (up to 16 rows; 17..64 for lanes built for them),
each tuned against cuBLAS plus the eager activation; the 64-row candidates include reductions in two
splits (float32 partials of both products, summed by a second kernel that then applies the activation).

What it does not do: biases, activations other than SiLU, more than :data:`~hf_rstitch.fast.kernels.gemv.WIDE_ROWS`
rows (the module's own forward runs), CPU execution outside Triton's interpreter. Which MLPs run it, and
how: :mod:`hf_rstitch.fast.patches.gated_mlp`.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.nn.functional as F

from . import gemv, shortlist
from .gemv import MAX_ROWS, WIDE_ROWS, GemvConfig
from .triton_support import _triton, available, cold_copies, cycling, fastest, interpreted, pdl, start

# two [BLOCK_N, BLOCK_K] float32 accumulators a program: the one-row candidates that fit registers twice
CANDIDATES = tuple(c for c in gemv.CANDIDATES if c.block_n * c.block_k <= 4096)
FEW_ROWS = tuple(GemvConfig(n, k, 4, 2, MAX_ROWS) for n in (16, 32, 64) for k in (64, 128))
# two [64, BLOCK_N] float32 accumulators a program
WIDE = tuple(GemvConfig(n, k, w, s, WIDE_ROWS) for n, k, w, s in (
    (32, 64, 4, 3), (32, 128, 4, 3), (64, 64, 4, 3), (64, 64, 8, 4), (64, 128, 8, 3), (128, 64, 8, 3))) + (
    GemvConfig(64, 64, 4, 3, WIDE_ROWS, 2), GemvConfig(64, 128, 8, 3, WIDE_ROWS, 2))  # reductions in 2 splits


@functools.lru_cache(maxsize=1)
def _kernel():
    triton, tl = _triton()
    # names the kernel calls, in this module's globals
    globals()["_rstd"], globals()["_input"], globals()["_waited_rstd"] = gemv._norm_parts()

    @triton.jit
    def gated_kernel(x_ptr, g_ptr, u_ptr, y_ptr, nw_ptr, eps, N, K, stride_g, stride_u, EVEN_N: tl.constexpr,
                     EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
                     NORM: tl.constexpr):
        # y[n] = silu(sum_k g[n, k] x[k]) * sum_k u[n, k] x[k] for the BLOCK_N rows of this program; NORM: x is
        # RMS-normalized with weight nw first, as in gemv's one-row kernel
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.arange(0, BLOCK_K)
        acc_g = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        start = 0
        if PDL and EVEN_N and EVEN_K:  # the first weight tiles are read while the kernel before finishes
            wg0 = tl.load(g_ptr + rows[:, None] * stride_g + cols[None, :])
            wu0 = tl.load(u_ptr + rows[:, None] * stride_u + cols[None, :])
            rstd = _waited_rstd(x_ptr, eps, K, BLOCK_K, NORM, PDL)
            x0 = _input(x_ptr, nw_ptr, cols, cols < K, rstd, NORM)[None, :]
            acc_g += wg0.to(tl.float32) * x0
            acc_u += wu0.to(tl.float32) * x0
            start = BLOCK_K
        else:
            rstd = _waited_rstd(x_ptr, eps, K, BLOCK_K, NORM, PDL)
        for k0 in range(start, K, BLOCK_K):
            k = k0 + cols
            if EVEN_N and EVEN_K:
                wg = tl.load(g_ptr + rows[:, None] * stride_g + k[None, :])
                wu = tl.load(u_ptr + rows[:, None] * stride_u + k[None, :])
            else:
                inside = (rows[:, None] < N) & (k[None, :] < K)
                wg = tl.load(g_ptr + rows[:, None] * stride_g + k[None, :], mask=inside, other=0.0)
                wu = tl.load(u_ptr + rows[:, None] * stride_u + k[None, :], mask=inside, other=0.0)
            xf = _input(x_ptr, nw_ptr, k, k < K, rstd, NORM)[None, :]
            acc_g += wg.to(tl.float32) * xf
            acc_u += wu.to(tl.float32) * xf
        dtype = y_ptr.dtype.element_ty
        g = tl.sum(acc_g, axis=1).to(dtype).to(tl.float32)
        u = tl.sum(acc_u, axis=1).to(dtype).to(tl.float32)
        act = (g * tl.sigmoid(g)).to(dtype).to(tl.float32)
        tl.store(y_ptr + rows, (act * u).to(dtype), mask=rows < N)

    return gated_kernel


@functools.lru_cache(maxsize=1)
def _few_rows_kernel():
    triton, tl = _triton()

    @triton.jit
    def _activate(acc_g, acc_u, y_ptr):
        # as the eager module rounds: each product to the model's dtype (y's), the SiLU, then the product
        dtype = y_ptr.dtype.element_ty
        g = acc_g.to(dtype).to(tl.float32)
        u = acc_u.to(dtype).to(tl.float32)
        act = (g * tl.sigmoid(g)).to(dtype).to(tl.float32)
        return (act * u).to(dtype)

    # Triton resolves the names a kernel calls in its module's globals (the interpreter too), not in this closure
    globals()["_activate"] = _activate

    @triton.jit
    def gated_few_rows_kernel(x_ptr, g_ptr, u_ptr, y_ptr, part_ptr, M, N, K, k_chunk, stride_xm, stride_g, stride_u,
                              stride_ym, IEEE: tl.constexpr, UPCAST: tl.constexpr, SPLIT: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        if PDL:  # programmatic dependent launch: the kernel before is done and its writes are visible past the
            tl.extra.cuda.gdc_wait()  # wait; the next kernel may launch now (it waits for this one in turn)
            tl.extra.cuda.gdc_launch_dependents()
        m = tl.arange(0, BLOCK_M)
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.arange(0, BLOCK_K)
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        k_start = tl.program_id(1) * k_chunk  # SPLIT: this program's share of the reduction (else all of it)
        k_stop = tl.minimum(k_start + k_chunk, K)
        for k0 in range(k_start, k_stop, BLOCK_K):
            k = k0 + cols
            x = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :], mask=(m[:, None] < M) & (k[None, :] < k_stop),
                        other=0.0)
            inside = (n[:, None] < N) & (k[None, :] < k_stop)
            wg = tl.load(g_ptr + n[:, None] * stride_g + k[None, :], mask=inside, other=0.0)
            wu = tl.load(u_ptr + n[:, None] * stride_u + k[None, :], mask=inside, other=0.0)
            if UPCAST:  # Triton's CPU interpreter gets bf16/fp16 dot products wrong: exact fp32 instead
                xf = x.to(tl.float32)
                acc_g += tl.dot(xf, tl.trans(wg.to(tl.float32)), input_precision="ieee")
                acc_u += tl.dot(xf, tl.trans(wu.to(tl.float32)), input_precision="ieee")
            elif IEEE:
                acc_g += tl.dot(x, tl.trans(wg), input_precision="ieee")
                acc_u += tl.dot(x, tl.trans(wu), input_precision="ieee")
            else:
                acc_g += tl.dot(x, tl.trans(wg))
                acc_u += tl.dot(x, tl.trans(wu))
        out = (m[:, None] < M) & (n[None, :] < N)
        if SPLIT:  # float32 partials of both products: part[s, m, n] (gate) and part[s, m, N + n] (up)
            at = part_ptr + (tl.program_id(1) * BLOCK_M + m[:, None]) * (2 * N) + n[None, :]
            tl.store(at, acc_g, mask=out)
            tl.store(at + N, acc_u, mask=out)
        else:
            tl.store(y_ptr + m[:, None] * stride_ym + n[None, :], _activate(acc_g, acc_u, y_ptr),
                     mask=out)

    @triton.jit
    def sum_splits_kernel(part_ptr, y_ptr, M, N, n_splits, stride_ym, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          PDL: tl.constexpr):
        if PDL:  # programmatic dependent launch: the kernel before is done and its writes are visible past the
            tl.extra.cuda.gdc_wait()  # wait; the next kernel may launch now (it waits for this one in turn)
            tl.extra.cuda.gdc_launch_dependents()
        # both products summed over the splits in split order, then the activation
        m = tl.arange(0, BLOCK_M)
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        out = (m[:, None] < M) & (n[None, :] < N)
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in range(0, n_splits):
            at = part_ptr + (s * BLOCK_M + m[:, None]) * (2 * N) + n[None, :]
            acc_g += tl.load(at, mask=out, other=0.0)
            acc_u += tl.load(at + N, mask=out, other=0.0)
        tl.store(y_ptr + m[:, None] * stride_ym + n[None, :], _activate(acc_g, acc_u, y_ptr), mask=out)

    return gated_few_rows_kernel, sum_splits_kernel


def launch(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, cfg: GemvConfig, norm: torch.Tensor | None = None,
           eps: float = 0.0) -> torch.Tensor:
    """``silu(F.linear(x, gate)) * F.linear(x, up)`` for ``x`` ``[..., K]`` of 1..``cfg.block_m`` rows. One row
    only: ``norm`` (an RMSNorm's weight and ``eps``) normalizes ``x`` first (:mod:`hf_rstitch.fast.patches.folds`)."""
    n, k = gate.shape
    rows = x.numel() // k if x.shape[-1] == k else -1
    if rows < 1 or rows > cfg.block_m or up.shape != gate.shape:
        raise ValueError(f"gated gemv takes 1..{cfg.block_m} row(s) of {k} values and two weights of one shape, got "
                         f"x {tuple(x.shape)}, gate {tuple(gate.shape)}, up {tuple(up.shape)}")
    if gate.stride(1) != 1 or up.stride(1) != 1:
        raise ValueError("gated gemv needs weights whose rows are contiguous (stride 1 along K)")
    if norm is not None and (cfg.block_m != 1 or rows != 1):
        raise ValueError("a norm before the gated product runs in the one-row kernel only")
    y = torch.empty(x.shape[:-1] + (n,), dtype=x.dtype, device=x.device)
    grid = ((n + cfg.block_n - 1) // cfg.block_n,)
    on = pdl(x.device, rows)
    if cfg.block_m == 1:
        start(_kernel(), grid)(
            x.contiguous(), gate, up, y, norm if norm is not None else gate, float(eps), n, k, gate.stride(0),
            up.stride(0), EVEN_N=n % cfg.block_n == 0, EVEN_K=k % cfg.block_k == 0, BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages, PDL=on, NORM=norm is not None,
            launch_pdl=on)
        return y
    x2 = x.reshape(rows, k).contiguous()
    chunk, splits, part = gemv.split_reduction(k, 2 * n, cfg, x.device)  # partials of both products
    few_rows, sum_splits = _few_rows_kernel()
    start(few_rows, (grid[0], splits))(
        x2, gate, up, y, part, rows, n, k, chunk, x2.stride(0), gate.stride(0), up.stride(0), n,
        IEEE=gate.dtype == torch.float32, UPCAST=interpreted(), SPLIT=splits > 1, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages, PDL=on,
        launch_pdl=on)
    if splits > 1:
        start(sum_splits, (-(-n // gemv.SUM_BLOCK_N),))(
            part, y, rows, n, splits, n, BLOCK_M=cfg.block_m, BLOCK_N=gemv.SUM_BLOCK_N, num_warps=4, PDL=on,
            launch_pdl=on)
    return y


def reference(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, as the eager module does it."""
    return F.silu(F.linear(x, gate)) * F.linear(x, up)


@torch.library.custom_op("hf_rstitch::gated_gemv", mutates_args=())
def gated_op(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, block_n: int, block_k: int, num_warps: int,
             num_stages: int, block_m: int, split_k: int = 1, norm: Optional[torch.Tensor] = None,
             eps: float = 0.0) -> torch.Tensor:
    if not available(x.device):
        return reference(x if norm is None else gemv.rms_norm(x, norm, eps), gate, up)
    return launch(x, gate, up, GemvConfig(block_n, block_k, num_warps, num_stages, block_m, split_k), norm, eps)


@gated_op.register_fake
def _(x, gate, up, block_n, block_k, num_warps, num_stages, block_m, split_k=1, norm=None, eps=0.0):
    return x.new_empty(x.shape[:-1] + (gate.shape[0],))


def tune(gate: torch.Tensor, up: torch.Tensor, candidates, calls: int = 20, norm: torch.Tensor | None = None,
         eps: float = 0.0) -> Optional[GemvConfig]:
    """The fastest candidate on the device; for few rows ``None`` when cuBLAS and the eager product win. One row may
    be timed with the RMSNorm folded before it (``norm``, ``eps``; :mod:`hf_rstitch.fast.patches.fold_tuning`)."""
    rows = candidates[0].block_m
    if gate.device.type != "cuda":
        return candidates[0]
    x = torch.randn(rows, gate.shape[1], dtype=gate.dtype, device=gate.device)
    nxt = cycling(cold_copies((gate, up), calls))  # weights read from memory, as in a step (not from L2)
    baseline = (lambda: reference(x, *nxt())) if rows > 1 else None
    best = fastest(candidates, lambda cfg: launch(x, *nxt(), cfg, norm, eps), baseline, calls)
    if best is None and rows == 1:
        raise RuntimeError(f"no gated gemv configuration runs for weights of shape {tuple(gate.shape)}")
    return best


TIER_CANDIDATES = {1: CANDIDATES, MAX_ROWS: FEW_ROWS, WIDE_ROWS: WIDE}  # the search space (a lane times .shortlist's)


def _key(gate: torch.Tensor, top: int) -> tuple:
    return ("gated",) + gemv.shape_key(gate, None, top)


def configs_for(table: dict, gate: torch.Tensor, up: torch.Tensor, max_rows: int = MAX_ROWS) -> tuple:
    """A configuration per tier of :data:`~hf_rstitch.fast.kernels.gemv.TIERS` for this shape from ``table``, tuned on
    first sight (None: cuBLAS), for the tiers :func:`~hf_rstitch.fast.kernels.gemv.tiers_for` tunes."""
    out = []
    for top, tuned in zip(gemv.TIERS, gemv.tiers_for(max_rows)):
        key = _key(gate, top)
        if tuned and key not in table:
            table[key] = tune(gate, up, shortlist.candidates("gated", top, TIER_CANDIDATES))
        out.append(table[key] if tuned else None)
    return tuple(out)
