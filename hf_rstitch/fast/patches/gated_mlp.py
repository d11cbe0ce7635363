"""Which MLPs of a model run the gated-MLP kernel (:mod:`hf_rstitch.fast.kernels.gated`), and the forward
they run: a SiLU MLP whose gate and up projections the kernel can read (:func:`fusable`) gets one product for
gate, up and activation, then its own down projection; inputs of tiers not tuned (or where cuBLAS won) run the
module's products. At one row the layer may have folded its norm in (:mod:`.folds`): the forward takes it.
"""

from __future__ import annotations

import functools

import torch

from ..kernels import gated, gemv, shortlist
from ..kernels.gated import _key, configs_for, launch
from ..kernels.gemv import MAX_ROWS
from . import folds, linears


def pending(model: torch.nn.Module, table: dict, max_rows: int = MAX_ROWS, held: bool = False) -> list[tuple]:
    """``(candidates, run)`` for each MLP shape and tier that :func:`plan` would tune (not in ``table``; with
    ``held``: ``((choice,), run)`` for those it holds a kernel's configuration for); see
    :func:`hf_rstitch.fast.patches.linears.pending`."""
    jobs, seen = [], set()
    for m in model.modules():
        if not fusable(m):
            continue
        gate, up = m.gate_proj.weight, m.up_proj.weight
        for top, tuned in zip(gemv.TIERS, gemv.tiers_for(max_rows)):
            key = _key(gate, top)
            if tuned and key not in seen and (key in table) == held:
                seen.add(key)
                candidates = (shortlist.candidates("gated", top, gated.TIER_CANDIDATES) if not held
                              else tuple(c for c in (table[key],) if c is not None))
                run = functools.partial(launch, gate.new_empty(top, gate.shape[1]), gate, up)
                jobs += [(candidates, run)] if candidates else []
    return jobs


def silu_mlp(m: torch.nn.Module) -> bool:
    """A ``gate_proj / up_proj / down_proj`` MLP with a SiLU activation (Llama, Qwen2, Mistral, ...)."""
    act = getattr(m, "act_fn", None)
    return (all(hasattr(m, n) for n in ("gate_proj", "up_proj", "down_proj"))
            and (isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"))


def fusable(m: torch.nn.Module) -> bool:
    """A SiLU MLP whose gate and up projections the kernel can read as they are (no bias, one shape)."""
    if not silu_mlp(m):
        return False
    g, u = m.gate_proj, m.up_proj
    return (linears.readable(g) and linears.readable(u) and g.bias is None and u.bias is None
            and g.weight.shape == u.weight.shape and g.weight.dtype == u.weight.dtype
            and g.weight.device == u.weight.device)


def _forward(mlp: torch.nn.Module, cfgs: tuple, act_mul, x: torch.Tensor) -> torch.Tensor:
    t = gemv.tier(x.numel() // x.shape[-1])
    c = cfgs[t] if t is not None else None
    if c is None:  # a long catch-up, a tier not tuned, or cuBLAS measured faster: two products, then the activation
        gate, up = mlp.gate_proj(x), mlp.up_proj(x)
        return mlp.down_proj(mlp.act_fn(gate) * up if act_mul is None else act_mul(gate, up))
    norm, eps = folds.norm_for(x) or (None, 0.0)  # one row: the layer may have folded its norm in (.folds)
    h = torch.ops.hf_rstitch.gated_gemv(x, mlp.gate_proj.weight, mlp.up_proj.weight, c.block_n, c.block_k,
                                        c.num_warps, c.num_stages, c.block_m, c.split_k, norm, eps)
    return mlp.down_proj(h)


folds.TAKES_NORM.add(_forward)


def plan(model: torch.nn.Module, table: dict, act_mul=None,
         max_rows: int = MAX_ROWS) -> list[tuple[torch.nn.Module, functools.partial]]:
    """The MLP forwards to install (as :func:`hf_rstitch.fast.patches.linears.gemv_linears_on` installs them), tuned
    for inputs of up to ``max_rows`` rows. ``act_mul(gate, up)``: the activation product where the kernel does
    not run (None: the module's ``act_fn(gate) * up``; ``compile="parts"`` passes its compiled one)."""
    return [(m, functools.partial(_forward, m, configs_for(table, m.gate_proj.weight, m.up_proj.weight, max_rows),
                                  act_mul))
            for m in model.modules() if fusable(m)]
