"""Joining rows' prefill for a :class:`~hf_rstitch.fast.lane.FastLane`: every row that joins a running batch in
one step is prefilled together, in batched calls of the lane's join twin, not one one-row call each.

A joining row must hold the keys and values of the shared columns the lane has read (``seen``) before the next
step reads the last ones with every other row (:meth:`~hf_rstitch.fast.lane_rows.RowOps.add_rows`). The lane's
join twin (:meth:`~hf_rstitch.fast.lane_rows.RowOps._joiner`: the same model in the same kernels and graphs,
:data:`JOIN_ROWS` cache rows) runs them in groups of up to that many rows -- left-padded among themselves, the
columns that are padding in every row of a group skipped, rows of similar lengths grouped -- then each row's
slots are copied into its cache row. A group runs as one call per length bucket (a prompt longer than the
largest bucket as several), so a step with ``k`` joins costs ``ceil(k / JOIN_ROWS)`` calls' worth of weight
reads instead of ``k``.

What it does not do: spread one long prompt over several steps (:mod:`hf_rstitch.engine.admission` does, with
a token budget a step, through :class:`Stage`).
"""

from __future__ import annotations

import torch

from ..engine.lane import left_padding
from ..engine.step import to_device

JOIN_ROWS = 8  # rows the join twin prefills in one call (its static cache holds this many rows of `capacity`)


def prefill_rows(lane, dst: list[int], ids: torch.Tensor, host: torch.Tensor) -> int:
    """Fill ``lane``'s cache rows ``dst`` with the keys/values of ``ids`` ``[k, seen]`` (``host``: their mask, bool,
    on the CPU, left padding only). Returns the number of batched groups it ran. A row whose real columns all lie
    past ``seen`` (a lane that has not read the latest columns yet) has nothing to prefill: its slots are masked."""
    joiner = lane._joiner()
    pads = left_padding(host).tolist()
    order = sorted((i for i in range(len(dst)) if pads[i] < ids.shape[1]), key=lambda i: pads[i])  # similar lengths
    # share a group: less padding read
    groups = 0
    for start in range(0, len(order), joiner.max_rows):
        part = order[start:start + joiner.max_rows]
        at = torch.tensor(part, dtype=torch.long)
        run_group(joiner, ids[at], host[at])
        for i, r in enumerate(part):
            lane.cache.copy_row(joiner.cache, i, dst[r], lane.seen)
        groups += 1
    return groups


def run_group(joiner, ids: torch.Tensor, host: torch.Tensor) -> None:
    """``joiner`` (reset) reads ``ids`` ``[g, n]`` (mask ``host``, left-padded) into its cache rows ``[0, g)``: one
    batched catch-up from the first column that is real in some row (the padding columns before it count as
    read; the rows' own padding stays masked)."""
    joiner.reset()
    joiner._start(host)
    skip = min(left_padding(host).tolist())
    joiner.seen = skip
    joiner.cache.pos.fill_(skip)
    with torch.no_grad():
        joiner._run(to_device(ids[:, skip:], joiner.device), False)
