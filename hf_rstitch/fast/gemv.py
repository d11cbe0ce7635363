"""Batch-1 matrix-vector products for decode steps: one Triton kernel, tuned per weight shape.

Why: at batch size 1 every ``nn.Linear`` of a decode step is a matrix-vector product that reads
its whole weight once, so a token costs (weight bytes) / (bandwidth) at best. cuBLAS's batch-1
kernels reach that on very wide weights (the LM head) but not on the narrow ones: on an H200 the
q/k/v and o projections of Qwen2-7B ran at 1.8-2.9 TB/s against 4.2 TB/s of copy bandwidth, and
its split-K variants add a reduction kernel per product (benchmarks/results/engine_profile_*).
This module gives every weight shape its own launch configuration, measured on the device
(:func:`tune`), and routes a model's linear layers through it inside :func:`gemv_linears_on`.

What it does not do: products with more than one row (catch-up prefills keep ``F.linear``),
quantized weights, CPU execution (off CUDA the op falls back to ``F.linear``; the kernel itself
runs on CPU only under ``TRITON_INTERPRET=1``, which is how the CPU tests check it). Triton is
optional: without it :func:`available` is False and the fast engine keeps cuBLAS.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class GemvConfig:
    """Launch configuration: output rows per program, reduction chunk, warps, pipeline stages."""

    block_n: int = 8
    block_k: int = 512
    num_warps: int = 4
    num_stages: int = 3


CANDIDATES = tuple(  # the tuner's search space; each fits a program's accumulator in registers
    GemvConfig(n, k, w, s)
    for n, k, w in ((2, 1024, 4), (4, 512, 4), (4, 1024, 4), (8, 256, 4), (8, 512, 4), (8, 1024, 8),
                    (16, 256, 4), (16, 512, 8), (32, 128, 4), (32, 256, 8))
    for s in (2, 4)
)


@functools.lru_cache(maxsize=1)
def _triton():
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None
    return triton, tl


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def available(device: torch.device | str) -> bool:
    """True where the Triton kernel can run: CUDA with Triton installed (or Triton's interpreter)."""
    device = torch.device(device)
    return _triton() is not None and (device.type == "cuda" or interpreted())


@functools.lru_cache(maxsize=1)
def _kernel():
    triton, tl = _triton()

    @triton.jit
    def gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, K, stride_n,
                    HAS_BIAS: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # y[n] = sum_k w[n, k] * x[k] (+ b[n]) for the BLOCK_N rows of this program, fp32 accumulator
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
        cols = tl.arange(0, BLOCK_K)  # [BK]
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + cols
            w_at = w_ptr + rows[:, None] * stride_n + k[None, :]
            if EVEN_N and EVEN_K:
                w = tl.load(w_at)
                x = tl.load(x_ptr + k)
            else:
                w = tl.load(w_at, mask=(rows[:, None] < N) & (k[None, :] < K), other=0.0)
                x = tl.load(x_ptr + k, mask=k < K, other=0.0)
            acc += w.to(tl.float32) * x[None, :].to(tl.float32)
        y = tl.sum(acc, axis=1)  # [BN]
        if HAS_BIAS:
            y += tl.load(b_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)
        tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=rows < N)

    return gemv_kernel


def launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cfg: GemvConfig) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for ``x`` with one row (``[..., K]``, ``x.numel() == K``)."""
    n, k = weight.shape
    if x.numel() != k:
        raise ValueError(f"gemv takes one row of {k} values, got a tensor of shape {tuple(x.shape)}")
    if weight.stride(1) != 1:
        raise ValueError("gemv needs a weight whose rows are contiguous (stride 1 along K)")
    y = torch.empty(x.shape[:-1] + (n,), dtype=x.dtype, device=x.device)
    grid = ((n + cfg.block_n - 1) // cfg.block_n,)
    _kernel()[grid](
        x.contiguous(), weight, bias if bias is not None else weight, y, n, k, weight.stride(0),
        HAS_BIAS=bias is not None, EVEN_N=n % cfg.block_n == 0, EVEN_K=k % cfg.block_k == 0,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y


# A custom op: torch.compile sees one opaque call (no tracing into Triton), CUDA graphs record the launch.
@torch.library.custom_op("hf_rstitch::gemv", mutates_args=())
def gemv_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], block_n: int, block_k: int,
            num_warps: int, num_stages: int) -> torch.Tensor:
    if not available(x.device):
        return F.linear(x, weight, bias)
    return launch(x, weight, bias, GemvConfig(block_n, block_k, num_warps, num_stages))


@gemv_op.register_fake
def _(x, weight, bias, block_n, block_k, num_warps, num_stages):
    return x.new_empty(x.shape[:-1] + (weight.shape[0],))


def shape_key(weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
    return (tuple(weight.shape), weight.dtype, bias is not None, str(weight.device))


def tune(weight: torch.Tensor, bias: torch.Tensor | None, candidates=CANDIDATES, repeats: int = 20) -> GemvConfig:
    """The fastest candidate for this weight on its device (CUDA events; ~0.1 s per shape).

    Off CUDA (interpreter) returns the default configuration without timing.
    """
    if weight.device.type != "cuda":
        return GemvConfig()
    x = torch.randn(weight.shape[1], dtype=weight.dtype, device=weight.device)
    best, best_ms = None, float("inf")
    for cfg in candidates:
        try:
            launch(x, weight, bias, cfg)  # compile + warm up
        except Exception:  # noqa: BLE001 - a configuration the device cannot run (registers, shared memory)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            launch(x, weight, bias, cfg)
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end) / repeats
        if ms < best_ms:
            best, best_ms = cfg, ms
    if best is None:
        raise RuntimeError(f"no gemv configuration runs for a weight of shape {tuple(weight.shape)}")
    return best


def linear_modules(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The model's plain ``nn.Linear`` layers (decoder projections and the LM head)."""
    return [m for m in model.modules() if type(m) is torch.nn.Linear]


def tune_model(model: torch.nn.Module, table: dict | None = None) -> dict:
    """A configuration per distinct linear shape of ``model`` (entries already in ``table`` are kept)."""
    table = {} if table is None else table
    for m in linear_modules(model):
        key = shape_key(m.weight, m.bias)
        if key not in table:
            table[key] = tune(m.weight, m.bias)
    return table


def _forward(module: torch.nn.Linear, cfg: GemvConfig, x: torch.Tensor) -> torch.Tensor:
    if x.numel() != module.in_features:  # several rows (a catch-up prefill): cuBLAS
        return F.linear(x, module.weight, module.bias)
    return torch.ops.hf_rstitch.gemv(x, module.weight, module.bias, cfg.block_n, cfg.block_k, cfg.num_warps,
                                     cfg.num_stages)


def plan(model: torch.nn.Module, table: dict) -> list[tuple[torch.nn.Linear, GemvConfig]]:
    """The linear layers of ``model`` that have a tuned configuration in ``table``, with it."""
    pairs = [(m, table.get(shape_key(m.weight, m.bias))) for m in linear_modules(model)]
    return [(m, cfg) for m, cfg in pairs if cfg is not None]


@contextlib.contextmanager
def gemv_linears_on(layers: list[tuple[torch.nn.Linear, GemvConfig]]):
    """Inside the block, one-row calls of these linear layers run the tuned Triton kernel.

    ``layers`` comes from :func:`plan` (computed once: walking a model's modules on every call
    costs more host time than a decode step's launch). Only Python dispatch changes (an
    instance ``forward``); a CUDA graph captured inside keeps the kernels it recorded.
    """
    patched = []
    try:
        for m, cfg in layers:
            if "forward" not in m.__dict__:
                m.forward = functools.partial(_forward, m, cfg)
                patched.append(m)
        yield
    finally:
        for m in patched:
            del m.forward
