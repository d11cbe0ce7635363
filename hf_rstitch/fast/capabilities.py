"""Which GPU features the fast engine uses on which compute capability: the one table, and the queries over it.

Why: the fast engine was built and measured on Hopper (9.0), but its users have T4s (7.5), A100s (8.0), RTX
3090s / A10s (8.6), L4s / 4090s (8.9), B200s (10.0) and RTX 5090s (12.0). Every feature that not every one of
those GPUs has is a row of :data:`FEATURES` -- the capability it needs, what uses it, and what runs below it --
and every kernel and lane asks :func:`has` instead of comparing capabilities itself. ``docs/fast-engine.md``
carries the same table, rendered by :func:`markdown` (a test checks they agree).

Profiles: ``"native"`` (the default) uses what the GPU has; ``"generic"`` caps the capability at
:data:`GENERIC_CEILING` (Ada, 8.9), so a Hopper or Blackwell GPU runs what an Ampere / Ada GPU gets -- every
Hopper-only feature off -- which is how a Hopper machine measures that path. The profile comes from
``FastConfig(profile=...)`` (a lane runs inside :func:`profile_scope` of it), else ``$HF_RSTITCH_PROFILE``.
Triton's own choice of Hopper's warpgroup MMA for ``tl.dot`` follows the process's setting only:
:func:`triton_environment` names the variable (``DISABLE_MMA_V3``) a process sets before its first compile.

What it does not do: decide whether the fast engine runs at all on a GPU (:mod:`hf_rstitch.fast.support`
and the on-machine proof, :mod:`hf_rstitch.fast.proof`), or pick launch configurations (the tuners).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from typing import NamedTuple

import torch

PROFILE_ENV = "HF_RSTITCH_PROFILE"
PROFILES = ("native", "generic")
GENERIC_CEILING = (8, 9)  # "generic": what an Ada GPU (L4, RTX 4090) has; Hopper's and Blackwell's features off
# the GPUs users have, by compute capability (the targets every kernel is compile-checked for: tools/kernel_targets.py)
TARGETS = {(7, 5): "T4", (8, 0): "A100", (8, 6): "RTX 3090 / A10", (8, 9): "L4 / RTX 4090", (9, 0): "H100 / H200",
           (10, 0): "B200", (12, 0): "RTX 5090"}


class Feature(NamedTuple):
    """One GPU feature: the capability it needs (and the first it is gone from, ``until``), what in the fast
    engine uses it, what runs where it is missing."""

    name: str
    needs: tuple[int, int]
    used_by: str
    below: str
    until: tuple[int, int] | None = None

    def on(self, capability: tuple[int, int]) -> bool:
        """Whether a GPU of ``capability`` has it."""
        return capability >= self.needs and (self.until is None or capability < self.until)


FEATURES = {f.name: f for f in (
    Feature("bfloat16", (8, 0), "models loaded in bfloat16 (every kernel takes it)",
            "refused with the reason (load the models in float16: `torch_dtype=torch.float16`)"),
    Feature("pdl", (9, 0), "programmatic dependent launch of the one-row Triton kernels (`triton_support.pdl`)",
            "the same kernels launched one after another (built without `gdc_wait`)"),
    Feature("grouped_mm", (9, 0), "transformers' fused grouped GEMM for bfloat16 experts past the kernels' pairs",
            "`batched_mm` (on the device, no host loop)"),
    Feature("wgmma", (9, 0), "Triton's warpgroup MMA in the few-rows / wide products' `tl.dot` (Triton's choice)",
            "`mma.sync` tensor-core tiles (Triton lowers the same kernels; Blackwell: its own MMA)", (10, 0)),
    Feature("tma", (9, 0), "nothing (no kernel uses tensor descriptors)", "-"),
    Feature("fp8", (8, 9), "nothing (no float8 weights or caches)", "-"),
)}

_scoped: contextvars.ContextVar[str | None] = contextvars.ContextVar("hf_rstitch_profile", default=None)
_assumed: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("hf_rstitch_assumed", default=None)


def check_profile(name: str) -> str:
    """``name`` if it is a profile; else a ValueError saying which exist."""
    if name not in PROFILES:
        raise ValueError(f"the fast engine's profile must be one of {', '.join(PROFILES)} ('generic': what an "
                         f"Ampere / Ada GPU gets, every Hopper-only feature off), got {name!r}")
    return name


def active_profile() -> str:
    """The profile queries answer for: :func:`profile_scope`'s, else ``$HF_RSTITCH_PROFILE``, else ``"native"``."""
    scoped = _scoped.get()
    if scoped is not None:
        return scoped
    value = os.environ.get(PROFILE_ENV, "").strip().lower()
    if not value:
        return "native"
    try:
        return check_profile(value)
    except ValueError as err:
        raise ValueError(f"{PROFILE_ENV}={os.environ[PROFILE_ENV]!r}: {err}; unset it for 'native'") from None


@contextlib.contextmanager
def profile_scope(name: str | None):
    """Within the block, queries answer for profile ``name`` (None: leave the active one)."""
    token = _scoped.set(check_profile(name)) if name is not None else None
    try:
        yield
    finally:
        if token is not None:
            _scoped.reset(token)


@contextlib.contextmanager
def assume(capability: tuple[int, int]):
    """Within the block, every device counts as a CUDA GPU of ``capability`` (cross-compiling kernels for a
    target: tools/kernel_targets.py; tests)."""
    token = _assumed.set(tuple(capability))
    try:
        yield
    finally:
        _assumed.reset(token)


def device_capability(device: torch.device | str) -> tuple[int, int] | None:
    """``device``'s compute capability as the fast engine may use it: the GPU's (or :func:`assume`'s), capped at
    :data:`GENERIC_CEILING` under the generic profile; None off CUDA."""
    assumed = _assumed.get()
    device = torch.device(device) if isinstance(device, str) else device
    if assumed is None and device.type != "cuda":
        return None
    capability = assumed or tuple(torch.cuda.get_device_capability(device))
    return min(capability, GENERIC_CEILING) if active_profile() == "generic" else capability


def has(feature: str, device: torch.device | str) -> bool:
    """Whether the fast engine may use ``feature`` (a key of :data:`FEATURES`) on ``device``."""
    if feature not in FEATURES:
        raise KeyError(f"no GPU feature {feature!r}; the table has {', '.join(FEATURES)}")
    capability = device_capability(device)
    return capability is not None and FEATURES[feature].on(capability)


def triton_environment(profile: str | None = None) -> dict[str, str]:
    """Environment a process sets before Triton's first compile to run ``profile`` (default: the active one)
    fully: under "generic" Triton's warpgroup MMA off (``DISABLE_MMA_V3=1``), nothing under "native"."""
    return {"DISABLE_MMA_V3": "1"} if check_profile(profile or active_profile()) == "generic" else {}


def markdown() -> str:
    """:data:`FEATURES` x :data:`TARGETS` as the Markdown table docs/fast-engine.md carries."""
    caps = sorted(TARGETS)
    head = "| feature | needs | " + " | ".join(f"{a}.{b}" for a, b in caps) + " | used by | where missing |"
    rule = "|" + "---|" * (len(caps) + 4)
    rows = [f"| {f.name} | {_span(f)} | " + " | ".join("yes" if f.on(c) else "no" for c in caps) + f" | {f.used_by} | {f.below} |"
            for f in FEATURES.values()]
    gpus = "GPUs: " + "; ".join(f"{a}.{b} {name}" for (a, b), name in sorted(TARGETS.items())) + "."
    return "\n".join([head, rule, *rows, "", gpus])


def _span(feature: Feature) -> str:
    low = f"{feature.needs[0]}.{feature.needs[1]}"
    return low if feature.until is None else f"{low} (not {feature.until[0]}.{feature.until[1]}+)"
