"""Where the split-K decode attention (:mod:`.decode_attention`) runs: head sizes, dtypes, devices and layouts it
takes; and the fallback of a lane that plans every call for it.
"""

from __future__ import annotations

import torch

from .triton_support import available


def runs_for(head_dim: int, dtype: torch.dtype, device) -> bool:
    """The kernel runs for heads of this size and dtype on ``device``: CUDA (or Triton's interpreter), a
    power-of-two head size >= 16, no float64."""
    return available(device) and head_dim >= 16 and head_dim & (head_dim - 1) == 0 and dtype != torch.float64


def supported(query: torch.Tensor, key: torch.Tensor) -> bool:
    """The kernel runs for this call (:func:`runs_for`, and the head dimension contiguous)."""
    return runs_for(query.shape[-1], query.dtype, query.device) and key.stride(-1) == 1 and query.stride(-1) == 1


def refuse_fallback(*args, **kwargs):
    """The fallback of a lane whose steps build no mask (every call of it runs the kernel): it never reads one."""
    raise RuntimeError("the fast engine's split attention could not run a call its lane planned for it (its steps "
                       "build no mask for the fallback). Please report it; FastConfig(attention='matmul') avoids it.")
