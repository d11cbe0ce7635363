"""MoE experts for decode steps: two Triton kernels that read only the experts the rows selected.

Why: a decode step of an MoE model runs its experts on a few (row, expert) pairs -- ``rows x top_k``, 8 at
batch 1 for Qwen3-30B-A3B -- and its floor is the bytes of those experts' weights. transformers' on-device
dispatches spend far more: ``grouped_mm`` sorts the pairs and runs a grouped GEMM built for many rows a group,
``batched_mm`` copies each pair's weights (``benchmarks/results/engine_batched_qwen3_moe_*.md``). Here each
pair is a matrix-vector product:

* :func:`gate_up` -- per pair ``s`` (row ``s // top_k``, expert ``ids[s]``): ``silu(W_gate x) * (W_up x)``, the
  ``[gate; up]`` halves of ``gate_up_proj[ids[s]]`` read once, the activation fused;
* :func:`down` -- per row: ``sum_k weights[k] * down_proj[ids[k]] @ act[k]`` over its ``top_k`` pairs, the
  routing weights' scaled sum fused (no atomics: one program owns its output columns, so it is deterministic);
  for one-row steps split a program a pair (each weighted term stored, then their sum), which fills the GPU.

Forwards of several rows (up to :data:`MAX_PAIRS` pairs) run :mod:`.expert_major`'s kernels instead (one program an
expert: each selected expert read once however many rows chose it; :data:`BY_EXPERT`).

Expert ids and routing weights are read on the device and the grid depends on shapes only, so a CUDA graph
holds both kernels. Rounding follows the batched dispatch in the weights' dtype (each product, the
activation and each weighted term rounded as the eager modules round them; sums in float32).

:func:`forward` is the experts implementation the lane registers with transformers (:data:`NAME`): these
kernels for up to :data:`MAX_PAIRS` pairs, transformers' fused ``grouped_mm`` (bfloat16, CUDA capability >= 9.0)
for more -- elsewhere the kernels still, as ``batched_mm`` would copy each pair's expert weights (it runs out
of memory at 8 rows of Qwen3-30B-A3B on an H200) -- and transformers' ``grouped_mm`` / ``batched_mm`` for
experts whose layout the kernels do not cover (:func:`why_not`: biases, transposed or interleaved weights, a
gate other than SiLU, a post-expert norm: gpt-oss).

What it does not do: quantized experts, expert parallelism; on CPU the kernels run only under
``TRITON_INTERPRET=1`` (the tests), otherwise the fallback dispatch runs.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from .. import capabilities
from . import expert_major
from .triton_support import _triton, available

NAME = "rstitch_gemv"  # the key in transformers' ExpertsInterface (config._experts_implementation)
# (row, expert) pairs a forward may have for the kernels; more run the fallback dispatch. On an H200 at the
# Qwen3-30B-A3B expert shape the kernels beat grouped_mm 2.7x at 8 pairs, 1.8x at 64, 1.08x at 256
# (benchmarks/results/experts_kernels_nvidia_h200.md)
MAX_PAIRS = 256


class Launch(NamedTuple):
    """A kernel's launch configuration: output columns a program, reduction chunk, warps."""

    block_n: int = 16
    block_k: int = 256
    warps: int = 4


GATE_UP = Launch(16, 256, 4)  # the best of 7 at 8, 64 and 256 pairs (results/experts_kernels_*.md)
DOWN = Launch(8, 256, 4)  # rows > SPLIT_ROWS: one program sums a row's top_k experts (best at 64 and 256 pairs)
DOWN_SPLIT = Launch(16, 256, 4)  # rows <= SPLIT_ROWS: one program a pair, then a sum over top_k
SPLIT_ROWS = 1  # one row's down product alone gives too few programs to fill the GPU
# several rows (up to MAX_PAIRS pairs): one program an expert (.expert_major), each selected expert read once;
# False: the pair kernels here for every forward
BY_EXPERT = True


def why_not(module: torch.nn.Module) -> str | None:
    """Why the kernels cannot run ``module`` (a transformers experts module), in one line; None when they can."""
    from transformers import activations
    from transformers.integrations import moe

    silu = tuple(c for c in (torch.nn.SiLU, getattr(activations, "SiLUActivation", None)) if c is not None)

    checks = (
        (getattr(module, "has_gate", False), "experts without a gate projection"),
        (not getattr(module, "has_bias", True), "experts with biases"),
        (not getattr(module, "is_transposed", True), "transposed expert weights"),
        (getattr(module, "is_concatenated", True), "interleaved gate / up weights"),
        (not getattr(module, "has_post_expert_norm", False), "a post-expert norm"),
        (not getattr(module, "_is_expert_parallel", False), "expert parallelism"),
        (isinstance(getattr(module, "act_fn", None), silu), "an activation other than SiLU"),
        (getattr(type(module), "_apply_gate", moe._default_apply_gate) is moe._default_apply_gate, "a custom gate"),
    )
    return next((f"{type(module).__name__} has {what}" for ok, what in checks if not ok), None)


def fused(hidden_states: torch.Tensor) -> bool:
    """Whether transformers' ``grouped_mm`` runs its fused grouped GEMM here (bfloat16 on CUDA from capability 9.0)."""
    return hidden_states.dtype == torch.bfloat16 and capabilities.has("grouped_mm", hidden_states.device)


def fallback(hidden_states: torch.Tensor):
    """transformers' on-device dispatch for the forwards the kernels leave: ``grouped_mm`` where it is fused
    (:func:`fused`), ``batched_mm`` elsewhere."""
    from transformers.integrations import moe

    return moe.ALL_EXPERTS_FUNCTIONS["grouped_mm" if fused(hidden_states) else "batched_mm"]


def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' experts forward (``hidden_states`` [T, H], ``top_k_index`` / ``top_k_weights`` [T, top_k]):
    the kernels for up to :data:`MAX_PAIRS` pairs, and for more where ``grouped_mm`` is not fused (``batched_mm``
    would copy every pair's expert weights: gigabytes a layer for a catch-up prefill); :func:`fallback` otherwise."""
    runs = (available(hidden_states.device) and hidden_states.dtype != torch.float64 and why_not(self) is None)
    if not runs or (top_k_index.numel() > MAX_PAIRS and fused(hidden_states)):
        return fallback(hidden_states)(self, hidden_states, top_k_index, top_k_weights)
    act = gate_up(hidden_states, self.gate_up_proj, top_k_index)
    return down(act, self.down_proj, top_k_index, top_k_weights)


def register() -> None:
    """Make :data:`NAME` an experts implementation transformers dispatches to (idempotent)."""
    from transformers.integrations import moe

    moe.ALL_EXPERTS_FUNCTIONS.register(NAME, forward)


def by_expert(ids: torch.Tensor) -> bool:
    """Whether a forward of these ``ids`` [T, top_k] runs :mod:`.expert_major`'s kernels (several rows, up to
    :data:`MAX_PAIRS` pairs: each selected expert read once) rather than the pair kernels here."""
    return BY_EXPERT and 1 < ids.shape[0] and ids.numel() <= MAX_PAIRS


def gate_up(x: torch.Tensor, gate_up_proj: torch.Tensor, ids: torch.Tensor, launch: Launch | None = None) -> torch.Tensor:
    """``silu(gate) * up`` of every pair: x [T, H], gate_up_proj [E, 2I, H] (gate rows first), ids [T, top_k]
    -> [T * top_k, I] in x's dtype. ``launch``: the pair kernel's; None: :mod:`.expert_major`'s kernel where
    :func:`by_expert`, else the pair kernel with :data:`GATE_UP`."""
    if launch is None:
        if by_expert(ids):
            return expert_major.gate_up(x, gate_up_proj, ids)
        launch = GATE_UP
    tokens, hidden = x.shape
    inter = gate_up_proj.shape[1] // 2
    pairs = ids.numel()
    out = torch.empty(pairs, inter, device=x.device, dtype=x.dtype)
    w = gate_up_proj.contiguous()
    _kernels()[0][(pairs, triton_cdiv(inter, launch.block_n))](
        x.contiguous(), w, ids.reshape(-1).contiguous(), out, hidden, inter, ids.shape[-1], w.stride(0),
        BLOCK_N=launch.block_n, BLOCK_K=launch.block_k, num_warps=launch.warps)
    return out


def down(act: torch.Tensor, down_proj: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
         launch: Launch | None = None, split: bool = False) -> torch.Tensor:
    """``sum_k weights[t, k] * down_proj[ids[t, k]] @ act[t * top_k + k]`` of every row: act [T * top_k, I],
    down_proj [E, H, I], ids / weights [T, top_k] -> [T, H] in act's dtype. ``split``: one program a pair
    (each weighted term to a buffer [T, top_k, H], as rounded as the eager terms, then their sum) instead of
    one a row. ``launch`` None: :mod:`.expert_major`'s kernel where :func:`by_expert`, else the pair kernels,
    split up to :data:`SPLIT_ROWS` rows."""
    if launch is None:
        if by_expert(ids):
            return expert_major.down(act, down_proj, ids, weights)
        split = ids.shape[0] <= SPLIT_ROWS
        launch = DOWN_SPLIT if split else DOWN
    tokens, top_k = ids.shape
    hidden, inter = down_proj.shape[1], down_proj.shape[2]
    round_terms = weights.dtype == act.dtype  # weights in the hidden dtype: each weighted term is rounded there
    out = torch.empty(tokens, top_k if split else 1, hidden, device=act.device,
                      dtype=torch.float32 if split and not round_terms else act.dtype)
    w = down_proj.contiguous()
    _kernels()[1][(tokens, triton_cdiv(hidden, launch.block_n), top_k if split else 1)](
        act.contiguous(), w, ids.contiguous(), weights.contiguous(), out, hidden, inter, top_k, w.stride(0),
        ROUND_TERMS=round_terms, SPLIT=split, BLOCK_N=launch.block_n, BLOCK_K=launch.block_k,
        num_warps=launch.warps)
    if not split:
        return out.view(tokens, hidden)
    return out.sum(dim=1).to(act.dtype)  # a sum of a low-precision dtype accumulates in float32, as the eager one


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.lru_cache(maxsize=1)
def _kernels():
    triton, tl = _triton()

    @triton.jit
    def _gate_up(x_ptr, w_ptr, ids_ptr, out_ptr, H, I, TOP_K, stride_e,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # one pair s, BLOCK_N of its I outputs: gate rows [n], up rows [I + n] of expert ids[s]
        s = tl.program_id(0)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.arange(0, BLOCK_K)
        expert = tl.load(ids_ptr + s).to(tl.int64)
        x_row = x_ptr + (s // TOP_K).to(tl.int64) * H
        gate_rows = w_ptr + expert * stride_e + n[:, None].to(tl.int64) * H
        up_rows = gate_rows + I.to(tl.int64) * H
        acc_g = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            k = k0 + cols
            xk = tl.load(x_row + k, mask=k < H, other=0.0).to(tl.float32)[None, :]
            inside = (n[:, None] < I) & (k[None, :] < H)
            acc_g += tl.load(gate_rows + k[None, :], mask=inside, other=0.0).to(tl.float32) * xk
            acc_u += tl.load(up_rows + k[None, :], mask=inside, other=0.0).to(tl.float32) * xk
        dtype = out_ptr.dtype.element_ty
        g = tl.sum(acc_g, axis=1).to(dtype).to(tl.float32)
        u = tl.sum(acc_u, axis=1).to(dtype).to(tl.float32)
        silu = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
        tl.store(out_ptr + s.to(tl.int64) * I + n, (silu * u).to(dtype), mask=n < I)

    @triton.jit
    def _down(a_ptr, w_ptr, ids_ptr, wts_ptr, out_ptr, H, I, TOP_K, stride_e,
              ROUND_TERMS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # one row t, BLOCK_N of its H outputs: the weighted sum over its TOP_K pairs (SPLIT: over pair
        # program_id(2) only, to out[t, j] in float32)
        t = tl.program_id(0)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.arange(0, BLOCK_K)
        dtype = a_ptr.dtype.element_ty
        total = tl.zeros((BLOCK_N,), dtype=tl.float32)
        if SPLIT:
            first = tl.program_id(2)
            last = first + 1
        else:
            first = 0
            last = TOP_K
        for j in range(first, last):
            s = t * TOP_K + j
            expert = tl.load(ids_ptr + s).to(tl.int64)
            weight = tl.load(wts_ptr + s).to(tl.float32)
            rows = w_ptr + expert * stride_e + n[:, None].to(tl.int64) * I
            a_row = a_ptr + s.to(tl.int64) * I
            acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
            for k0 in range(0, I, BLOCK_K):
                k = k0 + cols
                ak = tl.load(a_row + k, mask=k < I, other=0.0).to(tl.float32)[None, :]
                inside = (n[:, None] < H) & (k[None, :] < I)
                acc += tl.load(rows + k[None, :], mask=inside, other=0.0).to(tl.float32) * ak
            term = tl.sum(acc, axis=1).to(dtype).to(tl.float32) * weight
            if ROUND_TERMS:
                term = term.to(dtype).to(tl.float32)
            total += term
        if SPLIT:
            tl.store(out_ptr + (t * TOP_K + first).to(tl.int64) * H + n, total.to(out_ptr.dtype.element_ty), mask=n < H)
        else:
            tl.store(out_ptr + t.to(tl.int64) * H + n, total.to(dtype), mask=n < H)

    globals()["tl"] = tl  # the interpreter resolves triton.language in the kernels' module globals
    return _gate_up, _down
