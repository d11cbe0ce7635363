"""Edits of a transformers ``DynamicCache``'s layers in place, for the eager lane's row verbs
(:class:`~hf_rstitch.decode.lane.Lane`): rows appended, masked columns put in front, some rows moved a column
right, leading columns dropped, and whether a crop can roll the cache back.

Sliding-window layers keep only their window's columns (``cumulative_length`` counts what they have seen), so
the column edits recount what such a layer keeps instead of moving every stored column. The lane reaches into its
cache's layers only through these; it keeps its own books (columns seen, padding, mask).
"""

from __future__ import annotations

import torch


def append_rows(cache, fresh) -> None:
    """Append ``fresh``'s rows (a cache of the same columns) to ``cache``'s, on each layer's device."""
    for mine, new in zip(cache.layers, fresh.layers):
        mine.keys = torch.cat([mine.keys, new.keys.to(mine.keys.device)], dim=0)
        mine.values = torch.cat([mine.values, new.values.to(mine.values.device)], dim=0)


def prepend_columns(cache, n: int) -> None:
    """Put ``n`` zero (masked) columns in front of every row; a sliding layer grows only up to its window."""
    for layer in cache.layers:
        if not _filled(layer):
            continue
        stored = layer.keys.shape[-2]
        if layer.is_sliding:
            layer.cumulative_length += n
            grow = min(layer.cumulative_length, layer.sliding_window - 1) - stored
        else:
            grow = n
        if grow > 0:
            layer.keys = _prepend_zeros(layer.keys, grow)
            layer.values = _prepend_zeros(layer.values, grow)


def shift_rows_right(cache, rows: torch.Tensor, role) -> None:
    """Move the rows ``rows`` (CPU long) one column right: a zero column in front, the last one falls off.
    Full-attention layers only: a sliding layer keeps too few columns to move (``role`` names the lane)."""
    for layer in cache.layers:
        if not _filled(layer):
            continue
        if layer.is_sliding:
            raise ValueError(f"{role} lane: rows of a sliding-window model cannot wait (check_holdable)")
        at = rows.to(layer.keys.device)
        for states in (layer.keys, layer.values):
            states[at, :, 1:] = states[at, :, :-1].clone()
            states[at, :, 0] = 0


def drop_leading_columns(cache, cut: int) -> None:
    """Drop the first ``cut`` columns of every row; a sliding layer drops only what falls out of its window."""
    for layer in cache.layers:
        if not _filled(layer) or cut == 0:
            continue
        if layer.is_sliding:
            layer.cumulative_length -= cut
            drop = layer.keys.shape[-2] - min(layer.cumulative_length, layer.sliding_window - 1)
        else:
            drop = cut
        if drop > 0:
            layer.keys, layer.values = layer.keys[..., drop:, :], layer.values[..., drop:, :]


def not_rewindable(cache) -> str | None:
    """Why ``cache`` cannot be cropped back (a state that only moves forward), or None."""
    for layer in cache.layers:
        if any(getattr(layer, "is_recurrent_states_initialized", {}).values()):
            return (f"its {type(layer).__name__} layers hold a recurrent state (state-space or linear attention), "
                    "which a crop does not rewind")
        kernels = getattr(layer, "conv_kernel_size", {})
        if any(on and kernels.get(i) is None for i, on in getattr(layer, "is_conv_states_initialized", {}).items()):
            return f"its {type(layer).__name__} layers hold convolution states of no known width"
    return None


def _prepend_zeros(states: torch.Tensor, n: int) -> torch.Tensor:
    """``[B, H, S, D]`` -> ``[B, H, n + S, D]`` with zeros in front (masked slots)."""
    return torch.nn.functional.pad(states, (0, 0, n, 0))


def _filled(layer) -> bool:
    return getattr(layer, "is_initialized", True) and getattr(layer, "keys", None) is not None
