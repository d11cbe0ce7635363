"""The rotary embedding's cos and sin read from a table (``FastConfig(rotary_table=True)``).

Why: a Llama-family model computes its rotary cos and sin afresh on every forward: a float32 product of
the inverse frequencies and the positions, a concatenation, cos, sin, two scalings and two casts -- about
eight kernels a call, before the first layer, for values that depend on the position alone. A lane knows
every position it will ever see (its slots), so it asks the module once for all of them and each call
becomes one gather.

How: :func:`plan` calls each ``*RotaryEmbedding`` module's own forward over positions ``[0, n)`` (same
arithmetic: the table holds what the module returns) and installs an instance forward that indexes the
table, only where a probe at scattered positions gives the module's values to the last bits (:func:`close`).

What it does not do: RoPE types whose frequencies move with the sequence length (``dynamic``,
``longrope``), multimodal position ids (more than ``[batch, length]``), modules whose forward takes other
arguments; those keep their forward.
"""

from __future__ import annotations

import functools

import torch

MOVING = ("dynamic", "longrope")  # rope types whose inv_freq depends on the longest position seen


def plan(model: torch.nn.Module, n_positions: int) -> list[tuple[torch.nn.Module, functools.partial]]:
    """``(module, forward)`` for the rotary modules of ``model`` a table of ``n_positions`` positions serves."""
    out = []
    for m in model.modules():
        if not type(m).__name__.endswith("RotaryEmbedding") or getattr(m, "rope_type", "default") in MOVING:
            continue
        table = _table(m, n_positions, model.dtype, model.device)
        if table is not None:
            out.append((m, functools.partial(lookup, table)))
    return out


def lookup(table: torch.Tensor, x: torch.Tensor, position_ids: torch.Tensor):
    """The module's ``(cos, sin)`` ``[b, q, D]`` for ``position_ids`` ``[b, q]``: one gather, whose two halves are
    contiguous as the module's outputs are (compiled pieces that take them see the strides they saw)."""
    both = table[:, position_ids]  # [2, b, q, D]
    return both[0], both[1]


def _table(m: torch.nn.Module, n: int, dtype: torch.dtype, device) -> torch.Tensor | None:
    """``[2, n, D]`` cos and sin of positions ``[0, n)`` as ``m`` computes them, or None when ``m`` is not a
    rotary module this lookup stands in for (another signature, or values that differ on the probe)."""
    x = torch.zeros(1, 1, 1, dtype=dtype, device=device)
    try:
        with torch.no_grad():
            cos, sin = m(x, torch.arange(n, device=device)[None])
            probe = torch.tensor([[0, 1, n - 1], [n // 2, 3, n // 3]], device=device)
            want = m(x, probe)
    except Exception:  # noqa: BLE001 - another signature or layout: keep the module's forward
        return None
    if cos.dim() != 3 or cos.shape[:2] != (1, n) or sin.shape != cos.shape:
        return None
    table = torch.stack([cos[0], sin[0]])  # [2, n, D]
    got = lookup(table, x, probe)
    if not all(close(g, w) for g, w in zip(got, want)):
        return None
    return table


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal to the last bits: CPU cos and sin round differently in vectorised and scalar code, so a position can
    come out an ulp apart in calls of different shapes; anything further (another formula) is not the module."""
    eps = torch.finfo(want.dtype).eps
    return got.shape == want.shape and torch.allclose(got, want, rtol=4 * eps, atol=4 * eps)
