"""What a :class:`~hf_rstitch.fast.lane.FastLane` call gives back: the live rows of its graph's outputs, read out
of the graph's buffers (the next replay of either lane overwrites them), and the entropy and greedy token of
the logits it returned (:func:`~hf_rstitch.fast.kernels.fused_entropy.read_out` finds them on the way, on CUDA).

A mixin over the lane's state: ``device``, row bookkeeping (``rows``), the live-row order on the device
(``_slot_index``) and the last read-out (``_read``).
"""

from __future__ import annotations

import torch

from ..core.entropy import normalized_entropy
from .kernels import fused_entropy


class Outputs:
    """``entropy`` and ``greedy`` of the lane protocol, and the read-out behind them."""

    def entropy(self, logits: torch.Tensor) -> torch.Tensor:
        """The normalized entropy of ``logits`` (this lane's, ``[B, vocab]``): found when the logits were read
        out of the graph (the ones :meth:`advance` last returned), else on CUDA the fused kernels of
        :mod:`hf_rstitch.fast.kernels.fused_entropy` (one read of the logits, not half a dozen passes), elsewhere the eager function
        (CPU tests compare engines' entropies to 1e-9, the same arithmetic)."""
        found = self._read_for(logits)
        if found is not None:
            return found[1]
        if logits.device.type == "cuda" and fused_entropy.supported(logits):
            return fused_entropy.normalized_entropy(logits)
        return normalized_entropy(logits)

    def greedy(self, logits: torch.Tensor) -> torch.Tensor | None:
        """``torch.argmax(logits, -1)`` where it was found when the logits were read out of the graph (the ones
        :meth:`advance` last returned, on CUDA); else None (the caller picks the tokens itself)."""
        found = self._read_for(logits)
        return found[2] if found is not None else None

    def _read_out(self, out: torch.Tensor, device: torch.device) -> torch.Tensor:
        """The live rows of the graph's logits ``out`` as a new float32 tensor on ``device``. On CUDA one pass
        (:func:`hf_rstitch.fast.kernels.fused_entropy.read_out`) also finds their entropy and greedy tokens (:meth:`entropy`,
        :meth:`greedy`); elsewhere, or on another device than the lane's, a plain copy."""
        self._read = None
        if device != self.device or self.device.type != "cuda" or not fused_entropy.supported(out):
            return self._live(out).to(device=device, dtype=torch.float32, copy=True)
        index = self._slot_index
        live = self.rows.n_live
        copy, entropy, greedy = fused_entropy.read_out(out if index is not None or live == out.shape[0] else out[:live],
                                                       index)
        self._read = (copy, entropy, greedy)
        return copy

    def _read_for(self, logits: torch.Tensor) -> tuple | None:
        """The last read-out, if ``logits`` are its copy (what :meth:`advance` last returned)."""
        return self._read if self._read is not None and logits is self._read[0] else None

    def _live(self, out: torch.Tensor) -> torch.Tensor:
        """Rows of a graph output ``[b, ...]`` that belong to live rows, in the caller's order."""
        if self._slot_index is None:
            return out[: self.rows.n_live]
        return out.index_select(0, self._slot_index)
