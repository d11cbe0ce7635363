"""What a :class:`~hf_rstitch.fast.lane.FastLane` call gives back: a part the lane owns (``lane.outputs``). The live
rows of its graph's outputs, read out of the graph's buffers (the next replay of either lane overwrites them), and
the entropy and greedy token of the logits it returned (:func:`~hf_rstitch.fast.kernels.fused_entropy.read_out`
finds them on the way, on CUDA).

What it does not do: pick the live rows (the lane's :class:`~hf_rstitch.fast.lane_rows.LaneRows` says which).
"""

from __future__ import annotations

import torch

from ..core.entropy import normalized_entropy
from .kernels import fused_entropy


class ReadOut:
    """The read-out of the lane on ``device`` whose live rows ``rows`` (:class:`~.lane_rows.LaneRows`) holds;
    ``entropy`` and ``greedy`` of the lane protocol."""

    def __init__(self, device: torch.device, rows):
        self.device, self.rows = device, rows
        self.last = None  # (logits, entropy, greedy) of the last read-out on CUDA

    def read(self, out: torch.Tensor, device: torch.device) -> torch.Tensor:
        """The live rows of the graph's logits ``out`` as a new float32 tensor on ``device``. On CUDA one pass
        (:func:`hf_rstitch.fast.kernels.fused_entropy.read_out`) also finds their entropy and greedy tokens
        (:meth:`entropy`, :meth:`greedy`); elsewhere, or on another device than the lane's, a plain copy."""
        self.last = None
        if device != self.device or self.device.type != "cuda" or not fused_entropy.supported(out):
            return self.rows.live(out).to(device=device, dtype=torch.float32, copy=True)
        index, live = self.rows.index, self.rows.slots.n_live
        copy, entropy, greedy = fused_entropy.read_out(out if index is not None or live == out.shape[0] else out[:live],
                                                       index)
        self.last = (copy, entropy, greedy)
        return copy

    def entropy(self, logits: torch.Tensor) -> torch.Tensor:
        """The normalized entropy of ``logits`` (this lane's, ``[B, vocab]``): found when the logits were read
        out of the graph (the ones :meth:`read` last returned), else on CUDA the fused kernels of
        :mod:`hf_rstitch.fast.kernels.fused_entropy` (one read of the logits, not half a dozen passes), elsewhere
        the eager function (CPU tests compare engines' entropies to 1e-9, the same arithmetic)."""
        found = self._found(logits)
        if found is not None:
            return found[1]
        if logits.device.type == "cuda" and fused_entropy.supported(logits):
            return fused_entropy.normalized_entropy(logits)
        return normalized_entropy(logits)

    def greedy(self, logits: torch.Tensor) -> torch.Tensor | None:
        """``torch.argmax(logits, -1)`` where it was found when the logits were read out of the graph (the ones
        :meth:`read` last returned, on CUDA); else None (the caller picks the tokens itself)."""
        found = self._found(logits)
        return found[2] if found is not None else None

    def _found(self, logits: torch.Tensor) -> tuple | None:
        return self.last if self.last is not None and logits is self.last[0] else None
