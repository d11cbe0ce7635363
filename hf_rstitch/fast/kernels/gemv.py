"""Batch-1 matrix-vector products for decode steps: one Triton kernel, tuned per weight shape.

Why: at batch size 1 every ``nn.Linear`` of a decode step is a matrix-vector product that reads
its whole weight once, so a token costs (weight bytes) / (bandwidth) at best. cuBLAS's batch-1
kernels reach that on very wide weights (the LM head) but not on the narrow ones (the attention
projections of a 7B run well below copy bandwidth), and its split-K variants add a reduction kernel per
product (``benchmarks/results/gemv_*.md``).
This module gives every weight shape its own launch configuration, measured on the device
(:func:`tune`); :mod:`hf_rstitch.fast.patches.linears` routes a model's linear layers through it. The one-row kernel can also
normalize its input first (an RMSNorm) and add a residual to its output (:mod:`hf_rstitch.fast.patches.folds`).

Catch-up prefills of 2..16 tokens and batches of up to 16 rows (:data:`MAX_ROWS`) run a second
kernel that reads each weight tile once for all rows (tensor-core products). Batches of 17..64 rows
(:data:`WIDE_ROWS`, lanes built for them: ``linears.plan(rows=...)``) run it with 64-row blocks. Each tier
is tuned against cuBLAS per shape and keeps ``F.linear`` where cuBLAS wins. Inputs of more than
:data:`GEMM_ROWS` rows (batches of 65..256 rows, long catch-ups) run cuBLAS's GEMMs (``F.linear``, tensor cores)
untuned: there a weight tile read once serves enough rows that the product is no longer a pure weight read, which
is what cuBLAS's GEMM kernels are built for, while the few-rows kernel would read every weight once per 64-row
block.
Its candidates include reductions split in 2-4 (float32 partials, then a kernel that sums them), for
products with few output columns and a long reduction (Qwen2-7B's down projection: 3584 x 18944),
where cuBLAS splits too.

What it does not do: quantized weights, float64, CPU execution (off CUDA the op falls back to
``F.linear``; the kernel itself runs on CPU only under ``TRITON_INTERPRET=1``, which is how the CPU tests
check it). Triton is
optional: without it :func:`available` is False and the fast engine keeps cuBLAS.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from .triton_support import (_triton, available, cold_copies, cycling, fastest, interpreted,  # noqa: F401  (shared
                             next_pow2, pdl, start)  # by the kernels)


@dataclass(frozen=True)
class GemvConfig:
    """Launch configuration: output columns per program, reduction chunk, warps, pipeline stages,
    input rows per program (1: the one-row kernel; 16 or 64: the few-rows kernel on tensor cores), and
    for the few-rows kernel the splits of the reduction (``split_k`` > 1: each split's float32 partial
    sums, then a second kernel adds them: more programs for products with few output columns)."""

    block_n: int = 8
    block_k: int = 512
    num_warps: int = 4
    num_stages: int = 3
    block_m: int = 1
    split_k: int = 1


CANDIDATES = tuple(  # the tuner's search space; each fits a program's accumulator in registers
    GemvConfig(n, k, w, 2)
    for n, k, w in ((1, 2048, 4), (2, 1024, 4), (2, 2048, 4), (2, 512, 2), (4, 256, 2), (4, 512, 4), (4, 1024, 4),
                    (4, 1024, 8), (8, 256, 4), (8, 512, 4), (8, 512, 8), (16, 256, 4), (16, 512, 8), (32, 256, 8))
)
# (pipeline stages 2 and 4 time the same for every Qwen2 shape: results/gemv_*.json)
MAX_ROWS = 16  # catch-up prefills of 2..16 tokens run the few-rows kernel; longer ones keep cuBLAS
FEW_ROWS = (tuple(GemvConfig(n, k, 4, 2, MAX_ROWS) for n in (16, 32, 64) for k in (64, 128, 256))
            + tuple(GemvConfig(n, k, 4, 2, MAX_ROWS, s) for n in (32, 64) for k in (64, 128) for s in (2, 4))
            # deeper pipelines: more weight bytes in flight; the 3 kept of 9 tried (results/gemv_rows_sweep_*.md)
            + tuple(GemvConfig(n, k, 4, st, MAX_ROWS, s) for n, k, st, s in (
                (32, 256, 4, 1), (32, 128, 4, 4), (32, 256, 3, 2))))
WIDE_ROWS = 64  # one-token steps of 17..64 rows: the few-rows kernel with 64-row blocks, where it beats cuBLAS
WIDE = tuple(GemvConfig(n, k, w, s, WIDE_ROWS) for n, k, w, s in (
    (32, 64, 4, 3), (32, 128, 4, 3), (64, 64, 4, 3), (64, 128, 4, 3), (64, 64, 8, 4), (64, 128, 8, 3),
    (128, 64, 8, 3), (128, 128, 8, 3), (32, 128, 4, 4))) + tuple(  # the last: 7B's o at 32 rows (sweep)
        GemvConfig(n, k, w, st, WIDE_ROWS, s) for n, k, w, st, s in (
            (64, 64, 4, 3, 2), (64, 128, 8, 3, 2), (128, 64, 8, 3, 2), (64, 64, 4, 3, 4)))
SUM_BLOCK_N = 64  # output columns a program of the split-sum kernel (split_k > 1)
TIERS = (1, MAX_ROWS, WIDE_ROWS)  # rows of each tier's block; a shape has one configuration a tier
GEMM_ROWS = WIDE_ROWS  # inputs of more rows run cuBLAS GEMMs (F.linear) untuned: the switch to tensor-core GEMMs


def tier(rows: int) -> int | None:
    """Index in :data:`TIERS` of the configuration for an input of ``rows`` rows; None past the last
    (:data:`GEMM_ROWS`: cuBLAS's GEMMs)."""
    if rows > GEMM_ROWS:
        return None
    return next((i for i, top in enumerate(TIERS) if rows <= top), None)


@functools.lru_cache(maxsize=1)
def _norm_parts():
    """The RMSNorm prologue the one-row kernels share: :func:`_rstd` of the whole input, then each chunk of the
    input normalized (:func:`_input`) as the eager RMSNorm rounds it."""
    triton, tl = _triton()

    @triton.jit
    def _rstd(x_ptr, eps, K, BLOCK_K: tl.constexpr, NORM: tl.constexpr):
        # 1 / sqrt(mean(x^2) + eps) in float32 (1.0 without NORM)
        rstd = 1.0
        if NORM:
            cols = tl.arange(0, BLOCK_K)
            sq = tl.zeros((BLOCK_K,), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                xk = tl.load(x_ptr + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
                sq += xk * xk
            rstd = 1.0 / tl.sqrt(tl.sum(sq, axis=0) / K + eps)
        return rstd

    @triton.jit
    def _input(x_ptr, nw_ptr, k, inside, rstd, NORM: tl.constexpr):
        # x[k] in float32; with NORM as the eager RMSNorm gives it: (nw * (x * rstd).to(dtype)).to(dtype)
        x = tl.load(x_ptr + k, mask=inside, other=0.0)
        dtype = x_ptr.dtype.element_ty
        if NORM:
            xn = (x.to(tl.float32) * rstd).to(dtype).to(tl.float32)
            x = (tl.load(nw_ptr + k, mask=inside, other=0.0).to(tl.float32) * xn).to(dtype)
        return x.to(tl.float32)

    @triton.jit
    def _waited_rstd(x_ptr, eps, K, BLOCK_K: tl.constexpr, NORM: tl.constexpr, PDL: tl.constexpr):
        # PDL: wait for the kernel before (its writes are visible past the wait), then let the next one launch (it
        # waits for this one before reading anything); then :func:`_rstd`, which reads x, the kernel before's output
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        return _rstd(x_ptr, eps, K, BLOCK_K, NORM)

    # Triton resolves the names a kernel calls in its module's globals (the interpreter too), not in a closure;
    # the interpreter also looks for triton.language there when another module's kernel calls these
    globals()["_rstd"], globals()["_input"], globals()["tl"] = _rstd, _input, tl
    globals()["_waited_rstd"] = _waited_rstd
    return _rstd, _input, _waited_rstd


@functools.lru_cache(maxsize=1)
def _kernel():
    triton, tl = _triton()
    _norm_parts()

    @triton.jit
    def gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, nw_ptr, r_ptr, eps, N, K, stride_n,
                    HAS_BIAS: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr, NORM: tl.constexpr,
                    ADD: tl.constexpr):
        # y[n] = sum_k w[n, k] * x[k] (+ b[n]) for the BLOCK_N rows of this program, fp32 accumulator. NORM: x is
        # first RMS-normalized with weight nw (as the eager RMSNorm rounds: x * rstd to x's dtype, times nw to
        # x's dtype). ADD: r is added to the rounded product (a residual add after the layer)
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
        cols = tl.arange(0, BLOCK_K)  # [BK]
        dtype = y_ptr.dtype.element_ty
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        start = 0
        if PDL and EVEN_N and EVEN_K:  # the first weight tile is read while the kernel before finishes
            w0 = tl.load(w_ptr + rows[:, None] * stride_n + cols[None, :])
            rstd = _waited_rstd(x_ptr, eps, K, BLOCK_K, NORM, PDL)
            acc += w0.to(tl.float32) * _input(x_ptr, nw_ptr, cols, cols < K, rstd, NORM)[None, :]
            start = BLOCK_K
        else:
            rstd = _waited_rstd(x_ptr, eps, K, BLOCK_K, NORM, PDL)
        for k0 in range(start, K, BLOCK_K):
            k = k0 + cols
            w_at = w_ptr + rows[:, None] * stride_n + k[None, :]
            if EVEN_N and EVEN_K:
                w = tl.load(w_at)
            else:
                w = tl.load(w_at, mask=(rows[:, None] < N) & (k[None, :] < K), other=0.0)
            acc += w.to(tl.float32) * _input(x_ptr, nw_ptr, k, k < K, rstd, NORM)[None, :]
        y = tl.sum(acc, axis=1)  # [BN]
        if HAS_BIAS:
            y += tl.load(b_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)
        if ADD:
            y = y.to(dtype).to(tl.float32) + tl.load(r_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)
        tl.store(y_ptr + rows, y.to(dtype), mask=rows < N)

    return gemv_kernel


@functools.lru_cache(maxsize=1)
def _few_rows_kernel():
    triton, tl = _triton()

    @triton.jit
    def few_rows_kernel(x_ptr, w_ptr, b_ptr, y_ptr, part_ptr, M, N, K, k_chunk, stride_xm, stride_n, stride_ym,
                        HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr, SPLIT: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        if PDL:  # programmatic dependent launch: the kernel before is done and its writes are visible past the
            tl.extra.cuda.gdc_wait()  # wait; the next kernel may launch now (it waits for this one in turn)
            tl.extra.cuda.gdc_launch_dependents()
        # y[m, n] = sum_k x[m, k] * w[n, k] (+ b[n]) for M <= BLOCK_M rows: each weight tile is read once. With
        # SPLIT, program (nb, s) sums k in [s * k_chunk, +k_chunk) into its float32 partial part[s, m, n]
        m = tl.arange(0, BLOCK_M)  # [BM]
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
        cols = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        k_start = tl.program_id(1) * k_chunk
        k_stop = tl.minimum(k_start + k_chunk, K)
        for k0 in range(k_start, k_stop, BLOCK_K):
            k = k0 + cols
            x = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :], mask=(m[:, None] < M) & (k[None, :] < k_stop),
                        other=0.0)  # [BM, BK]
            w = tl.load(w_ptr + n[:, None] * stride_n + k[None, :], mask=(n[:, None] < N) & (k[None, :] < k_stop),
                        other=0.0)  # [BN, BK]
            if UPCAST:  # Triton's CPU interpreter gets bf16/fp16 dot products wrong: exact fp32 instead
                acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
            elif IEEE:
                acc += tl.dot(x, tl.trans(w), input_precision="ieee")
            else:
                acc += tl.dot(x, tl.trans(w))
        inside = (m[:, None] < M) & (n[None, :] < N)
        if SPLIT:
            tl.store(part_ptr + (tl.program_id(1) * BLOCK_M + m[:, None]) * N + n[None, :], acc, mask=inside)
        else:
            if HAS_BIAS:
                acc += tl.load(b_ptr + n, mask=n < N, other=0.0).to(tl.float32)[None, :]
            tl.store(y_ptr + m[:, None] * stride_ym + n[None, :], acc.to(y_ptr.dtype.element_ty), mask=inside)

    @triton.jit
    def sum_splits_kernel(part_ptr, b_ptr, y_ptr, M, N, n_splits, stride_ym, HAS_BIAS: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr):
        if PDL:  # programmatic dependent launch: the kernel before is done and its writes are visible past the
            tl.extra.cuda.gdc_wait()  # wait; the next kernel may launch now (it waits for this one in turn)
            tl.extra.cuda.gdc_launch_dependents()
        # y[m, n] = sum over splits of part[s, m, n] (+ b[n]), in split order
        m = tl.arange(0, BLOCK_M)
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        inside = (m[:, None] < M) & (n[None, :] < N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in range(0, n_splits):
            acc += tl.load(part_ptr + (s * BLOCK_M + m[:, None]) * N + n[None, :], mask=inside, other=0.0)
        if HAS_BIAS:
            acc += tl.load(b_ptr + n, mask=n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + m[:, None] * stride_ym + n[None, :], acc.to(y_ptr.dtype.element_ty), mask=inside)

    return few_rows_kernel, sum_splits_kernel


def launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cfg: GemvConfig,
           norm: torch.Tensor | None = None, eps: float = 0.0, residual: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for ``x`` ``[..., K]`` with one row (``cfg.block_m == 1``) or up
    to ``cfg.block_m`` rows (the few-rows kernel). One row only: ``norm`` (an RMSNorm's weight, ``[K]``, and its
    ``eps``) normalizes ``x`` first, and ``residual`` (``[..., N]``) is added to the product (:mod:`hf_rstitch.fast.patches.folds`)."""
    n, k = weight.shape
    rows = x.numel() // k if x.shape[-1] == k else -1
    if rows < 1 or rows > cfg.block_m:
        raise ValueError(f"this gemv configuration takes 1..{cfg.block_m} row(s) of {k} values, got a tensor of "
                         f"shape {tuple(x.shape)}")
    if (norm is not None or residual is not None) and (cfg.block_m != 1 or rows != 1):
        raise ValueError("a norm before or a residual after the product runs in the one-row kernel only")
    if weight.stride(1) != 1:
        raise ValueError("gemv needs a weight whose rows are contiguous (stride 1 along K)")
    y = torch.empty(x.shape[:-1] + (n,), dtype=x.dtype, device=x.device)
    grid = ((n + cfg.block_n - 1) // cfg.block_n,)
    b = bias if bias is not None else weight
    on = pdl(x.device, rows)
    if cfg.block_m == 1:
        start(_kernel(), grid)(
            x.contiguous(), weight, b, y, norm if norm is not None else weight,
            residual.contiguous() if residual is not None else y, float(eps), n, k, weight.stride(0),
            HAS_BIAS=bias is not None, EVEN_N=n % cfg.block_n == 0, EVEN_K=k % cfg.block_k == 0,
            BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            PDL=on, NORM=norm is not None, ADD=residual is not None, launch_pdl=on,
        )
        return y
    x2 = x.reshape(rows, k).contiguous()
    chunk, splits, part = split_reduction(k, n, cfg, x.device)
    few_rows, sum_splits = _few_rows_kernel()
    start(few_rows, (grid[0], splits))(
        x2, weight, b, y, part, rows, n, k, chunk, x2.stride(0), weight.stride(0), n,
        HAS_BIAS=bias is not None, IEEE=weight.dtype == torch.float32, UPCAST=interpreted(), SPLIT=splits > 1,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, PDL=on, launch_pdl=on,
    )
    if splits > 1:
        start(sum_splits, (-(-n // SUM_BLOCK_N),))(
            part, b, y, rows, n, splits, n, HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m, BLOCK_N=SUM_BLOCK_N,
            num_warps=4, PDL=on, launch_pdl=on)
    return y


def split_reduction(k: int, width: int, cfg: GemvConfig, device) -> tuple[int, int, torch.Tensor]:
    """``(chunk, splits, partials)`` for a few-rows kernel whose reduction over ``k`` runs in ``cfg.split_k``
    splits of whole ``block_k`` blocks (the last may be shorter): float32 room for ``splits`` partial
    ``[block_m, width]`` results, or a placeholder when there is one split (the kernel writes its output)."""
    chunk = -(-(-(-k // cfg.split_k)) // cfg.block_k) * cfg.block_k
    splits = -(-k // chunk)
    part = torch.empty(splits * cfg.block_m * width if splits > 1 else 1, dtype=torch.float32, device=device)
    return chunk, splits, part


# A custom op: torch.compile sees one opaque call (no tracing into Triton), CUDA graphs record the launch.
@torch.library.custom_op("hf_rstitch::gemv", mutates_args=())
def gemv_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], block_n: int, block_k: int,
            num_warps: int, num_stages: int, block_m: int, split_k: int = 1, norm: Optional[torch.Tensor] = None,
            eps: float = 0.0, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    if not available(x.device):
        return _reference(x, weight, bias, norm, eps, residual)
    return launch(x, weight, bias, GemvConfig(block_n, block_k, num_warps, num_stages, block_m, split_k), norm, eps,
                  residual)


@gemv_op.register_fake
def _(x, weight, bias, block_n, block_k, num_warps, num_stages, block_m, split_k=1, norm=None, eps=0.0,
      residual=None):
    return x.new_empty(x.shape[:-1] + (weight.shape[0],))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm, as the folded kernels compute it (:mod:`hf_rstitch.fast.patches.folds`)."""
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _reference(x, weight, bias, norm=None, eps=0.0, residual=None) -> torch.Tensor:
    y = F.linear(x if norm is None else rms_norm(x, norm, eps), weight, bias)
    return y if residual is None else y + residual


def shape_key(weight: torch.Tensor, bias: torch.Tensor | None, block_m: int = 1) -> tuple:
    return (tuple(weight.shape), weight.dtype, bias is not None, str(weight.device), block_m)


def tune(weight: torch.Tensor, bias: torch.Tensor | None, candidates=CANDIDATES, calls: int = 20,
         norm: torch.Tensor | None = None, eps: float = 0.0, add: bool = False) -> GemvConfig | None:
    """The fastest candidate for this weight on its device (~0.1 s per shape); for the few-rows
    kernel ``None`` when cuBLAS (``F.linear``) beats every candidate. One row may be timed with the fold it runs
    with (:mod:`hf_rstitch.fast.patches.fold_tuning`): ``norm`` (an RMSNorm's weight) and ``eps`` before the product,
    ``add`` a residual after it.

    Each candidate is timed as ``calls`` launches recorded in one CUDA graph: timed as separate
    launches, a few-microsecond kernel measures the host's launch rate, not the kernel.
    Off CUDA (interpreter) returns a default configuration without timing.
    """
    rows = candidates[0].block_m
    if weight.device.type != "cuda":
        return GemvConfig(block_m=rows) if rows == 1 else GemvConfig(32, 128, 4, 2, rows)
    x = torch.randn(rows, weight.shape[1], dtype=weight.dtype, device=weight.device)
    residual = torch.randn(rows, weight.shape[0], dtype=weight.dtype, device=weight.device) if add else None
    nxt = cycling(cold_copies((weight, bias), calls))  # weights read from memory, as in a step (not from L2)
    # few rows: cuBLAS is the baseline to beat, and often wins (results/gemv_*.md)
    baseline = (lambda: F.linear(x, *nxt())) if rows > 1 else None
    best = fastest(candidates, lambda cfg: launch(x, *nxt(), cfg, norm, eps, residual), baseline, calls)
    if best is None and rows == 1:
        raise RuntimeError(f"no gemv configuration runs for a weight of shape {tuple(weight.shape)}")
    return best


DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # the kernel accumulates in float32: no float64


def tiers_for(max_rows: int) -> tuple[bool, ...]:
    """Which tiers of :data:`TIERS` a lane of ``max_rows`` rows tunes: the first two always (one-token steps,
    catch-ups of a few tokens), the wide one only for ``max_rows`` above :data:`MAX_ROWS`."""
    return tuple(i < 2 or TIERS[i - 1] < max_rows for i in range(len(TIERS)))


TIER_CANDIDATES = {1: CANDIDATES, MAX_ROWS: FEW_ROWS, WIDE_ROWS: WIDE}  # the search space (a lane times .shortlist's)
