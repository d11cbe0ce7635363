"""RMSNorm, residual add + RMSNorm and the SiLU-gated product as Triton kernels: the pieces of
``compile="parts"`` without ``torch.compile`` for the models whose code they reproduce.

Why: ``compile="parts"`` (:mod:`hf_rstitch.fast.patches.regions`) fuses each norm, each residual add with the norm
after it and the SiLU gate of the MLP into one kernel by compiling them with ``torch.compile``. The kernels are a few lines
each, but getting them costs dynamo's tracing in every process (~3 s for a Qwen3-0.6B lane even with inductor's
caches warm, more on a fresh machine: ``benchmarks/results/engine_profile_*``), the bulk of a warm first call.
Here the same three pieces are hand-written: one program a row, the row read from memory once or twice,
nothing to trace or compile beyond Triton's own (cached on disk) build.

Same arithmetic as the modules they replace (a norm whose probe equals Llama's RMSNorm arithmetic,
:func:`llama_rms_norm`): the sum rounded to the model's dtype before it is normalized, ``x * rstd`` rounded to the dtype before the weight
multiplies it, ``silu(gate)`` rounded before it multiplies ``up``.

What it does not do: other norms (they keep the compiled piece), float64 (Triton's float32 arithmetic).
"""

from __future__ import annotations

import functools

import torch

from .. import probes
from .triton_support import _triton, available, next_pow2, start

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
BLOCK = 1024  # columns a program reads per step


@functools.lru_cache(maxsize=1)
def _kernels():
    triton, tl = _triton()

    @triton.jit
    def norm_kernel(x_ptr, h_ptr, w_ptr, total_ptr, y_ptr, eps, K, ADD: tl.constexpr, BLOCK_K: tl.constexpr):
        # one row: total = x (+ h, rounded to the dtype, stored); y = (w * (total * rstd).to(dtype)).to(dtype)
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK_K)
        dtype = y_ptr.dtype.element_ty
        sq = tl.zeros((BLOCK_K,), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            inside = k0 + cols < K
            x = tl.load(x_ptr + row * K + k0 + cols, mask=inside, other=0.0).to(tl.float32)
            if ADD:
                x = (x + tl.load(h_ptr + row * K + k0 + cols, mask=inside, other=0.0).to(tl.float32)).to(dtype)
                tl.store(total_ptr + row * K + k0 + cols, x, mask=inside)
                x = x.to(tl.float32)
            sq += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(sq, 0) / K + eps)
        if ADD:  # the sum is read back below, maybe by other threads of the program than the ones that wrote it
            tl.debug_barrier()
        for k0 in range(0, K, BLOCK_K):
            inside = k0 + cols < K
            if ADD:
                x = tl.load(total_ptr + row * K + k0 + cols, mask=inside, other=0.0).to(tl.float32)
            else:
                x = tl.load(x_ptr + row * K + k0 + cols, mask=inside, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + k0 + cols, mask=inside, other=0.0).to(tl.float32)
            y = (w * (x * rstd).to(dtype).to(tl.float32)).to(dtype)
            tl.store(y_ptr + row * K + k0 + cols, y, mask=inside)

    @triton.jit
    def silu_mul_kernel(g_ptr, u_ptr, y_ptr, n, BLOCK_N: tl.constexpr):
        # y = silu(g).to(dtype) * u, rounded to the dtype: as F.silu(gate) * up
        at = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
        inside = at < n
        dtype = y_ptr.dtype.element_ty
        g = tl.load(g_ptr + at, mask=inside, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + at, mask=inside, other=0.0).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
        tl.store(y_ptr + at, (s * u).to(dtype), mask=inside)

    return norm_kernel, silu_mul_kernel


def takes(x: torch.Tensor, weight: torch.Tensor | None = None) -> bool:
    """The kernels run for ``x`` (and a norm ``weight``): Triton on its device, a dtype of :data:`DTYPES`, the last
    axis contiguous and of the weight's size, the weight in ``x``'s dtype."""
    if not (available(x.device) and x.dtype in DTYPES and x.numel() > 0 and x.stride(-1) == 1):
        return False
    return weight is None or (weight.dim() == 1 and weight.shape[0] == x.shape[-1] and weight.dtype == x.dtype
                              and weight.device == x.device)


def llama_rms_norm(m) -> bool:
    """The kernel computes what ``m`` computes (Llama's RMSNorm arithmetic), shown by a probe on random rows
    (:func:`hf_rstitch.fast.probes.rms_norm`), in any model."""
    return m is not None and probes.rms_norm(m).same


@torch.library.custom_op("hf_rstitch::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm of ``x`` ``[..., K]`` (contiguous) with ``weight`` ``[K]``."""
    x = x.contiguous()
    y = torch.empty_like(x)
    k = x.shape[-1]
    start(_kernels()[0], (x.numel() // k,))(x, x, weight, x, y, float(eps), k, ADD=False,
                                           BLOCK_K=min(BLOCK, next_pow2(k)), num_warps=4)
    return y


@rms_norm.register_fake
def _(x, weight, eps):
    return torch.empty_like(x)


@torch.library.custom_op("hf_rstitch::add_rms_norm", mutates_args=())
def add_rms_norm(residual: torch.Tensor, h: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(residual + h, rms_norm(residual + h))`` in one launch (the sum rounded to the dtype first)."""
    residual, h = residual.contiguous(), h.contiguous()
    total, y = torch.empty_like(residual), torch.empty_like(residual)
    k = residual.shape[-1]
    start(_kernels()[0], (residual.numel() // k,))(residual, h, weight, total, y, float(eps), k, ADD=True,
                                                   BLOCK_K=min(BLOCK, next_pow2(k)), num_warps=4)
    return total, y


@add_rms_norm.register_fake
def _(residual, h, weight, eps):
    return torch.empty_like(residual), torch.empty_like(residual)


@torch.library.custom_op("hf_rstitch::silu_mul", mutates_args=())
def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up`` in one launch."""
    gate, up = gate.contiguous(), up.contiguous()
    y = torch.empty_like(gate)
    n = gate.numel()
    start(_kernels()[1], (-(-n // BLOCK),))(gate, up, y, n, BLOCK_N=BLOCK, num_warps=4)
    return y


@silu_mul.register_fake
def _(gate, up):
    return torch.empty_like(gate)


# ---- the pieces regions.plan installs ------------------------------------------------------------------
def norm_forward(module: torch.nn.Module, fallback, x: torch.Tensor) -> torch.Tensor:
    """A Llama RMSNorm ``module``'s forward: the kernel where :func:`takes` ``x``, else ``fallback(x)``."""
    if takes(x, module.weight):
        return torch.ops.hf_rstitch.rms_norm(x, module.weight, module.variance_epsilon)
    return fallback(x)


def add_norm_piece(fallback):
    """``(norm, residual, h) -> (residual + h, norm(residual + h))`` (:mod:`hf_rstitch.fast.patches.add_norm`'s
    piece): the kernel for Llama RMSNorms where it takes the tensors, else ``fallback``."""
    verdicts: dict = {}

    def piece(norm, residual, h):
        if norm not in verdicts:
            verdicts[norm] = llama_rms_norm(norm)
        if (verdicts[norm] and residual.shape == h.shape and residual.dtype == h.dtype and takes(residual, norm.weight)
                and takes(h)):
            return torch.ops.hf_rstitch.add_rms_norm(residual, h, norm.weight, norm.variance_epsilon)
        return fallback(norm, residual, h)

    return piece


def silu_mul_piece(fallback):
    """``(gate, up) -> F.silu(gate) * up``: the kernel where it takes the tensors, else ``fallback``."""
    def piece(gate, up):
        if gate.shape == up.shape and gate.dtype == up.dtype and takes(gate) and takes(up):
            return torch.ops.hf_rstitch.silu_mul(gate, up)
        return fallback(gate, up)

    return piece
