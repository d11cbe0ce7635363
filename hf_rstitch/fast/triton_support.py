"""What the fast engine's Triton kernels share: Triton itself (optional), where it runs, block sizes, and
the switch for programmatic dependent launch (:data:`PDL`)."""

from __future__ import annotations

import functools
import os

import torch


@functools.lru_cache(maxsize=1)
def _triton():
    try:
        import triton
        import triton.language as tl
        import triton.language.extra.cuda  # noqa: F401  (tl.extra.cuda.gdc_*: programmatic dependent launch)
    except ImportError:
        return None
    return triton, tl


def next_pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (Triton block sizes)."""
    return 1 << max(0, (n - 1).bit_length())


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def available(device: torch.device | str) -> bool:
    """True where the Triton kernel can run: CUDA with Triton installed (or Triton's interpreter)."""
    device = torch.device(device)
    return _triton() is not None and (device.type == "cuda" or interpreted())


# Programmatic dependent launch (compute capability 9+), experimental: a kernel launched with it starts while
# the kernel before it still runs, waits for that kernel's results before reading anything
# (griddepcontrol.wait; the one-row products read their first weight tiles before that wait), then lets the
# next kernel launch, so the launch and ramp-up of each small kernel overlap its predecessor. Measured on
# an H200 (benchmarks/results/engine_pdl_nvidia_h200.md): one-row steps gain (Qwen2-1.5B 1.61 -> 1.49 ms),
# batches of 8 lose (2.01 -> 2.11 ms), batches of 64 do not change. "one-row": launches over one row of
# activations only; "all": every launch; "off" (the default): none. Off by default because one GPU test
# (test_rope_store's fused-kernels equality, after 117 other GPU tests in the same process) had a CUDA
# graph capture invalidated with "one-row" on; it passed alone, and the cause is not found yet.
PDL = "off"
_PDL_MODES = ("off", "one-row", "all")


@functools.lru_cache(maxsize=8)
def _capability(device: torch.device) -> int:
    return torch.cuda.get_device_capability(device)[0]


def pdl(device: torch.device, rows: int) -> bool:
    """Whether a kernel launched now on ``device`` over ``rows`` rows of activations uses programmatic
    dependent launch (:data:`PDL`)."""
    if PDL not in _PDL_MODES:
        raise ValueError(f"triton_support.PDL must be one of {list(_PDL_MODES)}, got {PDL!r}")
    if PDL == "off" or (PDL == "one-row" and rows != 1):
        return False
    return device.type == "cuda" and not interpreted() and _capability(device) >= 9
