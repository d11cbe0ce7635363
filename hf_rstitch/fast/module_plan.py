"""Per module of a model: which fused kernel a :class:`~hf_rstitch.fast.lane.FastLane` runs in its place, or why the
model's own code runs -- the ``module`` lines of :class:`~hf_rstitch.fast.plan.FastPlan`.

Three kinds of module have a stand-in, each decided by a probe on random inputs (:mod:`hf_rstitch.fast.probes`):

* ``norm``: a ``*RMSNorm`` with its own forward (what ``compile="parts"`` fuses) runs the RMSNorm kernel
  (:mod:`hf_rstitch.fast.kernels.norms`) where its output equals the kernel's arithmetic;
* ``layer``: a decoder layer runs the add + norm pieces (:mod:`hf_rstitch.fast.patches.add_norm`) where its
  forward computes what they compute, and folds its adds and norms into its products at one row where its
  attention projects its input as it is (:func:`hf_rstitch.fast.patches.folds.plain_attention`);
* ``router``: an MoE router runs the router kernels (:mod:`hf_rstitch.fast.patches.routers`) where it returns
  what one of their two forms returns.

A module whose probe agrees still runs its own code where the plan does not run that kernel at all (no Triton on
the device, another ``compile`` mode, ``fuse_router=False``); its line says so. Modules of one class with one
answer share a line.

What it does not do: decide the products, the rotation or the rotary tables (the plan's other lines; the
rotation and the tables are probed where the lane builds them: :mod:`hf_rstitch.fast.kernels.rope_store`,
:mod:`hf_rstitch.fast.patches.rotary_table`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .patches import add_norm, folds, regions, routers
from . import probes

OWN = "model's own code"


class ModuleChoice(NamedTuple):
    """One line of the plan's modules: ``count`` modules of class ``module`` (``part``: norm, layer or router)
    run ``kernel`` in their place, or their own code (``kernel`` None), because of ``why``."""

    part: str
    module: str
    count: int
    kernel: str | None
    why: str

    def __str__(self) -> str:
        return f"{self.module} x{self.count} ({self.part}): {self.kernel or OWN}: {self.why}"


def choices(model: torch.nn.Module, norms_off: str | None, layers_off: str | None, routers_off: str | None,
            fold: bool) -> tuple[ModuleChoice, ...]:
    """The module lines of ``model``'s plan. ``*_off``: why the plan runs no norm kernel / layer pieces / router
    kernels at all (None: it runs them where the probe agrees); ``fold``: the plan folds norms at one row."""
    found: dict[tuple, int] = {}
    for m in model.modules():
        line = _choice(m, norms_off, layers_off, routers_off, fold)
        if line is not None:
            found[line] = found.get(line, 0) + 1
    return tuple(ModuleChoice(part, name, count, kernel, why) for (part, name, kernel, why), count in found.items())


def _choice(m, norms_off, layers_off, routers_off, fold) -> tuple | None:
    """``(part, class, kernel or None, why)`` for a module that has a stand-in; None for any other module."""
    name = type(m).__name__
    if regions.norm_candidate(m):
        return ("norm", name, *_decide(probes.rms_norm(m), "rms_norm kernel", norms_off))
    if name.endswith("DecoderLayer"):
        kernel, why = _decide(add_norm.verdict(m), "add + norm pieces", layers_off)
        if kernel is not None and fold:
            attention = folds.plain_attention(m.self_attn)
            kernel += "; folded into its products at one row" if attention.same else ""
            why += "" if attention.same else f"; not folded at one row: attention {attention.why}"
        return ("layer", name, kernel, why)
    if hasattr(m, "top_k") and isinstance(getattr(m, "weight", None), torch.nn.Parameter):
        kind, verdict = routers.verdict(m)
        return ("router", name, *_decide(verdict, f"router kernels ({kind} form)", routers_off))
    return None


def _decide(verdict: probes.Verdict, kernel: str, off: str | None) -> tuple[str | None, str]:
    if not verdict.same:
        return None, verdict.why
    if off is not None:
        return None, f"{off}; {verdict.why}"
    return kernel, verdict.why
