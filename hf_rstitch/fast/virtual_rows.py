"""Joining rows read inside the step's own call, as virtual rows (``FastConfig(virtual_joins=V)``): a part the lane
owns (``lane.virtual``).

Why: a join call of the join twin (:mod:`.joins`) reads each model's weights once more for a few prompt tokens. At
short requests (``serve_reasoning.py --scale 0.05``: prompts of 8, a join every other step at 256 clients) those
calls are 14-23 % of a serving step on an H200. Here a joining row's prompt is read in the lane's next call,
beside every live row's tokens, for the cost of the call's extra rows, not of another weight read.

How (the design in docs/serving.md, "What is left"): a paged cache addresses a row's token ``t`` by its block table
and its padding count (``t = column - pad``), whichever cache row reads it. A call reads columns ``[seen, seen + w)``
in a length bucket of ``s >= w`` columns. So the joiner's prompt (its tokens before the lane's ``seen`` columns) is cut
in chunks of ``s`` tokens, the first left-padded; for each chunk starting at token ``t`` a free cache row takes a copy
of the joiner's block-table row and the padding count ``seen - t``, and the call reads the chunk there and stores its
keys and values in the joiner's blocks. Every row of a layer stores before any attends, so the prompt's tokens see
each other causally, as the twin's prefill would (``tests/fast/test_virtual_rows.py`` holds that property). In a
one-column call each virtual row is one token; in a stitched LLM call that catches up ``w`` columns, a chunk of ``s``.
The virtual rows' logits are dropped and their table rows point at the trash block again once the call is queued.

When the lane falls back to the join twin (:meth:`VirtualJoins.flush`, the same prefill as without this part, one batch
for every join kept): the next call reads more than :data:`WIDEST` columns, the chunks need more than ``V`` rows or
more than the free cache rows, or a crop, a stage or the joiner's own wait comes between the join and the next call
(rows leaving, the columns moving on the left and other rows waiting are followed). Joins are never kept where the
cache is static or the lane gathers its rows (``compact_rows``): the twin prefills them at once (and refuses while
it holds a stage, which it would overwrite). Tokens and caches equal the twin's either way.

What it does not do: chunked joins (a staged prompt is copied from its stage, as before).
"""

from __future__ import annotations

import torch

from ..decode.step import to_device
from .blocks import TRASH
from .buckets import bucket_for

# The widest call (its length bucket) that virtual rows ride: a lane warms its spare rows' batch buckets up to this
# length only. Every length bucket there cost 19 GiB more reserved graph memory on an H200 (random Qwen2 7B / 1.5B,
# 256 rows; engine_variants_nvidia_h200_virtual.md) for calls that are rare: a stitched step's LLM call reads 1.0-1.1
# columns on average at 8 to 256 clients (serve_reasoning_nvidia_h200_split.md). A wider call flushes.
WIDEST = 4


class VirtualJoins:
    """Joins waiting for the lane's next call (:meth:`filler`), read there as virtual rows (:meth:`place`) or by the
    join twin (:meth:`flush`). ``calls`` / ``rows``: calls that carried virtual rows and the rows they carried;
    ``flushes``: the twin's batches instead, by why."""

    def __init__(self, lane):
        self.lane = lane
        self.budget = lane.config.virtual_joins if lane.paged else 0
        self.pending: list[tuple[list[int], torch.Tensor, torch.Tensor]] = []  # (cache rows, ids, host mask)
        self.placed: torch.Tensor | None = None  # the virtual rows of the call being made (cleared by finish)
        self.reads = None  # what ready() found the kept joins read (and the call's length bucket), for place()
        self.calls = self.rows = 0
        self.flushes: dict[str, int] = {}  # why kept joins took the join twin instead (a verb, or the call)

    def filler(self, fill, seq: torch.Tensor, staged: list[int] | None):
        """``fill(free, host)`` for :meth:`~.lane_rows.LaneRows.add`: the joining rows kept for the next call where
        this part is on (their first ``seen`` columns: ``seq[:, :seen]``), else ``fill`` (the twin's prefill)."""
        if self.budget <= 0 or staged is not None or self.lane.compact is not None or self.lane.joins.stage is not None:
            return fill  # (with a stage in the join twin the twin refuses at once, not at a later flush)
        seen = self.lane.seen

        def keep(free: list[int], host: torch.Tensor) -> None:
            self.pending.append((list(free), seq[:, :seen], host[:, :seen]))

        return keep

    def flush(self, why: str, held: list[int] | None = None) -> None:
        """The kept joins prefilled by the join twin now (before a verb they cannot follow moves the lane's rows or
        columns), in one batch however many steps kept them; ``why``: the verb, counted in :attr:`flushes`. With
        ``held`` (live rows that wait a step, ``hold_rows``), only where one of them is a kept join."""
        if not self.pending:
            return
        if held is not None:
            rows = {self.lane.kv.slots.slot[i] for i in held}
            if not any(row in rows for free, _, _ in self.pending for row in free):
                return
        rows = [(row, ids[i], host[i]) for free, ids, host in self.pending for i, row in enumerate(free)]
        free, ids, host = zip(*rows)  # kept at one width: every verb that moves the columns flushes or follows
        self.lane.joins.prefill(list(free), torch.stack(ids), torch.stack(host))  # raises: still kept
        self.pending = []
        self.flushes[why] = self.flushes.get(why, 0) + 1

    def keep_rows(self, index) -> None:
        """The lane keeps its live rows ``index`` (:meth:`~.lane_rows.LaneRows.keep`), and the kept joins that stay
        follow their rows to their new cache rows (a paged cache moves a row's table row, never its keys and values:
        the blocks they will be read into move with it); those that left are dropped, never read."""
        before = list(self.lane.kv.slots.slot) if self.pending else None
        self.lane.kv.keep(index)
        if before is None:
            return
        index = index.tolist() if isinstance(index, torch.Tensor) else list(index)
        if self.lane.seen == 0:  # nothing read yet (the rows stay where they were): nothing kept to read either
            self.pending = []
            return
        after = self.lane.kv.slots.slot
        moved = {before[i]: after[j] for j, i in enumerate(index)}
        pending = []
        for free, ids, host in self.pending:
            stay = [k for k, row in enumerate(free) if row in moved]
            if stay:
                at = torch.tensor(stay, dtype=torch.long)
                pending.append(([moved[free[k]] for k in stay], ids[at], host[at]))
        self.pending = pending

    def shifted(self, n: int) -> None:
        """After the shared columns moved ``n`` to the right (``n > 0``: masked columns in front, ``pad_left``) or
        ``-n`` to the left (leading padding dropped, ``trim_left``): the kept joins' columns move with them."""
        def move(t: torch.Tensor, fill) -> torch.Tensor:
            return torch.nn.functional.pad(t, (n, 0), value=fill) if n > 0 else t[:, -n:]
        self.pending = [(free, move(ids, 0), move(host, False)) for free, ids, host in self.pending]

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
        lane = self.lane
        if width > min(WIDEST, lane.config.max_bucket):
            self.flush("wide call")
            return False
        size = bucket_for(width, lane.buckets)
        owners, starts, ids = self._reads(size)
        if not owners:  # no joiner has a token before ``seen``: nothing to read
            self.pending = []
            return False
        if len(owners) > min(self.budget, lane.kv.slots.max_rows - lane.kv.slots.n_live):
            self.flush("too many rows")
            return False
        self.reads = (size, owners, starts, ids)
        return True

    def place(self, new_ids: torch.Tensor):
        """For a call reading ``new_ids`` ``[B, width]`` of the live rows, once :meth:`ready` and the call's blocks
        reserved: ``(ids, placed)`` -- the call's ids ``[B + R, size]`` (``size``: the width's length bucket; the live
        rows' right-padded, the ``R`` virtual rows' chunks after them) and (batch bucket, cache row of each, width) --
        the virtual rows' table rows and padding set on the device."""
        lane = self.lane
        (size, owners, starts, ids), self.reads = self.reads, None
        virtual = lane.kv.slots.free()[: len(owners)]
        self.pending = []
        dev = lane.kv.device
        at = to_device(virtual, dev)
        cache = lane.cache
        cache.table.index_copy_(0, at, cache.table.index_select(0, to_device(owners, dev)))
        pads = to_device([lane.seen - t for t in starts], dev)  # column seen + j reads token t + j
        lane.kv.n_pad.index_copy_(0, at, pads)
        lane.kv.valid.index_copy_(0, at, cache.slot_ids[None, : lane.kv.valid.shape[1]] >= pads[:, None])
        live = lane.kv.index if lane.kv.index is not None else torch.arange(new_ids.shape[0], device=dev)
        bucket = bucket_for(max(*lane.rows.slot, virtual[-1]) + 1, lane.rows.sizes)
        self.placed = at
        self.calls += 1
        self.rows += len(virtual)
        width = new_ids.shape[1]
        chunks = to_device(ids, dev).to(new_ids.dtype)  # [R, size]
        ids = torch.cat([torch.nn.functional.pad(new_ids, (0, size - width)), chunks])
        return ids, (bucket, torch.cat([live, at]), width)

    def finish(self) -> None:
        """After the call is queued, or failed: the virtual rows' table rows point at the trash block again (a later
        call's dead rows write there, never in the joiner's blocks)."""
        if self.placed is not None:
            self.lane.cache.table.index_fill_(0, self.placed, TRASH)
            self.placed = None

    def _reads(self, size: int):
        """``(owners, starts, ids)``: each kept joiner's prompt (its tokens before the lane's ``seen`` columns) in
        chunks of ``size`` tokens, one a virtual row, the first left-padded so that the last ends on the prompt's
        last token: for each chunk the cache row that owns it, its first token's index (negative: padding) and its
        ``size`` ids (host lists; 0 for padding, which writes to the trash block). Each token is read by one row: a
        chunk's right padding would write over the next chunk's tokens in the same call."""
        owners, starts, ids = [], [], []
        for free, seq, host in self.pending:
            real = host.sum(1).tolist()  # left padding only: a row's real columns are its last ones
            for r, (row, n) in enumerate(zip(free, real)):
                prompt = seq[r, seq.shape[1] - n:].tolist()
                first = n - -(-n // size) * size  # <= 0
                for t in range(first, n, size):
                    owners.append(row)
                    starts.append(t)
                    ids.append([0] * max(0, -t) + prompt[max(t, 0): t + size])
        return owners, starts, ids
