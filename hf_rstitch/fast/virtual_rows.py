"""Joining rows read inside the step's own call, as virtual rows (``FastConfig(virtual_joins=V)``): a part the lane
owns (``lane.virtual``).

Why: a join call of the join twin (:mod:`.joins`) reads each model's weights once more for a few prompt tokens. At
short requests (``serve_reasoning.py --scale 0.05``: prompts of 8, a join every other step at 256 clients) those
calls are 14-23 % of a serving step on an H200. Here a joining row's prompt is read in the next one-column call of
the lane, beside every live row's token, for the cost of the call's extra rows, not of another weight read.

How (the design in docs/serving.md, "What is left"): a paged cache addresses a row's token ``t`` by its block table
and its padding count (``t = column - pad``), whichever cache row reads it. So for each token ``t`` of a joiner's
prompt before the lane's ``seen`` columns, a free cache row takes a copy of the joiner's block-table row and the
padding count ``seen - t``; the one-column call at column ``seen`` then reads token ``t`` there and stores its keys
and values in the joiner's blocks. Every row of a layer stores before any attends, so the prompt's tokens see each
other causally, as the twin's prefill would (``tests/fast/test_virtual_rows.py`` holds that property). The virtual
rows' logits are dropped and their table rows point at the trash block again once the call is queued.

When the lane falls back to the join twin (:meth:`VirtualJoins.flush`, the same prefill as without this part): the
next call reads more than one column, the prompts hold more than ``V`` tokens or more than the free cache rows, the
cache is static, the lane gathers its rows (``compact_rows``), or any other verb (rows leaving, waiting, columns
moving, a reset) comes between the join and the next call. Tokens and caches equal the twin's either way.

What it does not do: chunked joins (a staged prompt is copied from its stage, as before).
"""

from __future__ import annotations

import torch

from ..decode.step import to_device
from .blocks import TRASH
from .buckets import bucket_for


class VirtualJoins:
    """Joins waiting for the lane's next call (:meth:`filler`), read there as virtual rows (:meth:`place`) or by the
    join twin (:meth:`flush`). ``calls`` / ``rows``: calls that carried virtual rows and the rows they carried."""

    def __init__(self, lane):
        self.lane = lane
        self.budget = lane.config.virtual_joins if lane.paged else 0
        self.pending: list[tuple[list[int], torch.Tensor, torch.Tensor]] = []  # (cache rows, ids, host mask)
        self.placed: torch.Tensor | None = None  # the virtual rows of the call being made (cleared by finish)
        self.reads = None  # what ready() found the kept joins read, for place()
        self.calls = self.rows = 0

    def filler(self, fill, seq: torch.Tensor, staged: list[int] | None):
        """``fill(free, host)`` for :meth:`~.lane_rows.LaneRows.add`: the joining rows kept for the next call where
        this part is on (their first ``seen`` columns: ``seq[:, :seen]``), else ``fill`` (the twin's prefill)."""
        if self.budget <= 0 or staged is not None or self.lane.compact is not None:
            return fill
        seen = self.lane.seen

        def keep(free: list[int], host: torch.Tensor) -> None:
            self.pending.append((list(free), seq[:, :seen], host[:, :seen]))

        return keep

    def flush(self, keep=None) -> None:
        """The kept joins prefilled by the join twin now (before anything moves the lane's rows or columns); with
        ``keep`` (the live rows that stay, as ``keep_rows`` takes them), only the joiners among them."""
        if not self.pending:
            return
        stay = None if keep is None else {self.lane.kv.slots.slot[int(i)] for i in keep}
        while self.pending:
            free, ids, host = self.pending.pop(0)
            picked = [i for i, row in enumerate(free) if stay is None or row in stay]
            if picked:
                at = torch.tensor(picked, dtype=torch.long)
                self.lane.joins.prefill([free[i] for i in picked], ids[at], host[at])

    def forget(self) -> None:
        """Nothing kept, nothing placed (the lane is reset)."""
        self.finish()
        self.pending = []

    def ready(self, width: int) -> bool:
        """Before a call reading ``width`` columns (and before its blocks are reserved): True where the kept joins
        ride in it (:meth:`place`); else they are prefilled by the join twin now, so that the call's reservation
        covers the blocks the twin hands over."""
        if not self.pending:
            return False
        self.reads = self._reads() if width == 1 else None
        free = self.lane.kv.slots.max_rows - self.lane.kv.slots.n_live
        if self.reads is None or not self.reads[0] or len(self.reads[0]) > min(self.budget, free):
            self.reads = None
            self.flush()
            return False
        return True

    def place(self, new_ids: torch.Tensor):
        """For a one-column call reading ``new_ids`` ``[B, 1]`` of the live rows, once :meth:`ready` and the call's
        blocks reserved: ``(ids, placed)`` -- the call's ids with the virtual rows' tokens after the live rows', and
        (batch bucket, cache row of each) -- the virtual rows' table rows and padding set on the device."""
        lane = self.lane
        (owners, tokens, ids), self.reads = self.reads, None
        virtual = sorted(set(range(lane.kv.slots.max_rows)) - set(lane.kv.slots.slot))[: len(owners)]
        self.pending = []
        dev = lane.kv.device
        at = to_device(virtual, dev)
        cache = lane.cache
        cache.table.index_copy_(0, at, cache.table.index_select(0, to_device(owners, dev)))
        pads = to_device([lane.seen - t for t in tokens], dev)
        lane.kv.n_pad.index_copy_(0, at, pads)
        lane.kv.valid.index_copy_(0, at, cache.slot_ids[None, : lane.kv.valid.shape[1]] >= pads[:, None])
        live = lane.kv.index if lane.kv.index is not None else torch.arange(new_ids.shape[0], device=dev)
        bucket = bucket_for(max(*lane.rows.slot, virtual[-1]) + 1, lane.rows.sizes)
        self.placed = at
        self.calls += 1
        self.rows += len(virtual)
        ids = torch.cat([new_ids, to_device(ids, dev)[:, None].to(new_ids.dtype)])
        return ids, (bucket, torch.cat([live, at]))

    def finish(self) -> None:
        """After the call is queued, or failed: the virtual rows' table rows point at the trash block again (a later
        call's dead rows write there, never in the joiner's blocks)."""
        if self.placed is not None:
            self.lane.cache.table.index_fill_(0, self.placed, TRASH)
            self.placed = None

    def _reads(self):
        """``(owners, tokens, ids)``: for each prompt token before the lane's ``seen`` columns of each kept joiner,
        the cache row that owns it, its token index and its id (host lists)."""
        owners, tokens, ids = [], [], []
        for free, seq, host in self.pending:
            real = host.sum(1).tolist()  # left padding only: a row's real columns are its last ones
            for row, n, r in zip(free, real, range(len(free))):
                owners += [row] * n
                tokens += list(range(n))
                ids += seq[r, seq.shape[1] - n:].tolist()
        return owners, tokens, ids
