"""Each call of a fast lane runs only the rows that need its logits: a part the lane owns (``lane.compact``).

Why: a full-width lane runs every live row whenever any row needs it (the lane protocol's ``advance``), so at 64
rows of which 20 are the LLM's the LLM's graph runs 64 rows. Here a call names the rows it needs (``run``); they
are gathered into cache rows ``[0, b)`` of the smallest batch bucket ``b`` holding them (a captured graph's) and
only that bucket runs. Gathering swaps cache rows (:meth:`~.lane_rows.LaneRows.swap`): with the paged cache an
index (table rows, padding counts, masks), no keys or values move; a static cache copies the rows' slots.

Rows that sit a call out fall behind: each live row has the columns it has read (``RowSlots.read``), and a call
brings each row it runs up to date from there, as a solo run would. One graph call reads the same columns in
every row, so the rows a call needs run in at most two graph calls (:func:`groups`): the rows that read the most
columns (most rows of a step, reading one column), then the rest (rows handed over from the other model) in one
catch-up from the fewest columns any of them read; a catch-up row that read further reads its columns from there
again (the same keys and values, computed again: a step's weight reads stay at two however the rows' columns
spread). A group's bucket may hold more rows than it needs; its other places go, in this order, to rows that
have read the same columns (they catch up, their logits come along), to free cache rows and rows further behind
(their writes land past what they have read and are written again when they catch up), and only where no such
row is left, to rows that read past the group's columns (they read those columns again). A row's tokens,
entropies and routes are those of the full-width lane (tested up to 256 rows; logits to 1e-9 in fp64).

Counts (:class:`RowCounts`, every fast lane's ``row_counts``, full-width or not): ``rows_run`` (rows of the graphs
run) and ``rows_needed`` (rows whose logits the callers asked for), over the lane's life, for benchmarks to report
rows run against rows taking part.
"""

from __future__ import annotations

import time

import torch

from ..decode.step import to_device
from .buckets import bucket_for


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class RowCounts:
    """A lane's calls, the rows its graphs ran and the rows whose logits its callers needed, summed (its life)."""

    def __init__(self):
        self.calls = self.runs = self.rows_run = self.rows_needed = 0

    def add(self, run: int, needed: int, runs: int = 1) -> None:
        """One call: ``run`` rows of graphs run over ``runs`` graph calls, for ``needed`` rows."""
        self.rows_run += run
        self.rows_needed += needed
        self.runs += runs
        self.calls += 1

    def as_dict(self) -> dict[str, int]:
        return {"calls": self.calls, "runs": self.runs, "rows_run": self.rows_run, "rows_needed": self.rows_needed}


def groups(need: list[int], read: list[int]) -> list[tuple[int, list[int]]]:
    """The graph calls that bring the live rows ``need`` (``read``: columns each has read) up to date, as
    ``(first column read, rows)``: the rows that read the most columns (a step's one-column rows), then every other
    row in one catch-up from the fewest columns any of them read (a row that read further reads its columns from
    there again). At most two calls, whatever the spread of the rows' columns read."""
    if not need:
        return []
    top = max(read[r] for r in need)
    first = [r for r in need if read[r] == top]
    rest = [r for r in need if read[r] != top]
    return [(top, first)] + ([(min(read[r] for r in rest), rest)] if rest else [])


class Compact:
    """``lane``'s calls over named rows (:meth:`advance`), counted in ``lane.counts``."""

    def __init__(self, lane):
        self.lane = lane

    def call(self, seq: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor, resumed: torch.Tensor, want_hidden: bool,
             run: torch.Tensor | None):
        """The lane's ``advance`` (:meth:`~.lane.FastLane.advance`'s arguments): the rows ``run`` (``[B]`` bool CPU;
        None: every row) brought up to date (:meth:`advance`), ``lane.ran`` set, the records of ``rows`` made."""
        lane, total = self.lane, seq.shape[1]
        lane.kv.check(seq, mask, total)
        lane.kv.reserve(total)
        start = 0.0
        if lane.timing:
            _sync(lane.device)
            start = time.perf_counter()
        lane.outputs.last = None  # no fused read-out here: entropy and greedy tokens found from the logits
        logits, hidden, ran = self.advance(seq, None if run is None else run.nonzero().flatten().tolist(), want_hidden)
        if logits is None:  # no row needed: nothing ran
            logits = torch.zeros(seq.shape[0], lane.vocab, dtype=torch.float32, device=seq.device)
        lane.ran = torch.tensor(ran, dtype=torch.bool)
        seconds = None
        if lane.timing:
            _sync(lane.device)
            seconds = time.perf_counter() - start
        calls = lane.rows.records(lane.role, total, rows.tolist(), resumed.tolist(), seconds)
        lane.seen = max(lane.seen, total)
        return logits, hidden, calls

    def advance(self, seq: torch.Tensor, run: list[int] | None, want_hidden: bool):
        """Bring the live rows ``run`` (all when None) up to ``seq``'s ``T`` columns, each from the columns it has read.

        Returns logits ``[B, vocab]`` float32 on ``seq``'s device, hidden ``[B, D]`` or None (zeros in rows not
        run), and ``[B]`` flags: the rows whose logits are the last column's (``run`` and the rows that caught up
        with them)."""
        slots, total = self.lane.kv.slots, seq.shape[1]
        need = list(range(slots.n_live)) if run is None else run
        behind = [r for r in need if slots.read[r] >= total]
        if behind:
            raise RuntimeError(f"{self.lane.role} FastLane asked to advance rows {behind[:8]} that have read every "
                               f"one of the {total} columns already; a call names only rows with columns to read")
        out = _Outputs(slots.n_live, seq.device)
        run_rows = runs = 0
        for start, rows in groups(need, slots.read):
            group = [r for r in rows if not out.ran[r]]  # rows that caught up in an earlier group's bucket are done
            if group:
                run_rows += self._group(seq, group, start, want_hidden, out)
                runs += 1
        self.lane.cache.pos.fill_(total)  # the invariant other verbs keep: every call leaves pos at seen
        self.lane.counts.add(run_rows, len(need), runs)
        return out.logits, out.hidden, out.ran

    def _group(self, seq: torch.Tensor, group: list[int], start: int, want_hidden: bool, out: _Outputs) -> int:
        """One call over the rows ``group`` (all read ``start`` columns) in the smallest bucket holding them; returns
        the bucket's rows."""
        lane, kv = self.lane, self.lane.kv
        slots, total = kv.slots, seq.shape[1]
        bucket = bucket_for(len(group), slots.sizes)
        kv.swap(place(group, bucket, start, slots.slot, slots.read, slots.max_rows))
        inside = [r for r, c in enumerate(slots.slot) if c < bucket]  # live rows in the bucket: each reads its columns
        new = seq.index_select(0, to_device(inside, seq.device)).narrow(1, start, total - start)
        lane.cache.pos.fill_(start)
        with torch.no_grad():
            logits, hidden = lane.run(new if new.device == lane.device else new.to(lane.device), want_hidden,
                                      rows=(bucket, to_device([slots.slot[r] for r in inside], lane.device)))
        caught = [r for r in inside if slots.read[r] >= start]  # read every column up to total now
        for r in caught:
            slots.read[r] = total
        out.take(caught, [slots.slot[r] for r in caught], logits, hidden, lane.device)
        return bucket


class _Outputs:
    """The rows' logits and hidden states as calls find them (copied out of the graph's buffers at once)."""

    def __init__(self, rows: int, device: torch.device):
        self.rows, self.device = rows, device
        self.ran = [False] * rows
        self.logits: torch.Tensor | None = None
        self.hidden: torch.Tensor | None = None

    def take(self, live: list[int], cache_rows: list[int], logits: torch.Tensor, hidden, lane_device) -> None:
        at, src = to_device(live, self.device), to_device(cache_rows, lane_device)
        if self.logits is None:
            self.logits = torch.zeros(self.rows, logits.shape[-1], dtype=torch.float32, device=self.device)
        self.logits.index_copy_(0, at, logits.index_select(0, src).to(self.device, torch.float32))
        if hidden is not None:
            if self.hidden is None:
                self.hidden = hidden.new_zeros(self.rows, hidden.shape[-1])
            self.hidden.index_copy_(0, at.to(hidden.device), hidden.index_select(0, src))
        for r in live:
            self.ran[r] = True


def place(group: list[int], bucket: int, start: int, slot: list[int], read: list[int], max_rows: int
          ) -> list[tuple[int, int]]:
    """The cache-row swaps that bring the live rows ``group`` into cache rows ``[0, bucket)`` and fill the bucket's
    other places as well as the rows allow (the module docstring's order), moving as few rows as it can.

    ``slot``/``read``: each live row's cache row and columns read; ``start``: the group's columns read."""
    owner = {c: r for r, c in enumerate(slot)}

    def rank(c: int) -> int:  # how well cache row c fills a place of this call: 0 best, 2 reads columns again
        r = owner.get(c)
        return 1 if r is None or read[r] < start else 0 if read[r] == start else 2

    mine = {slot[r] for r in group}
    front = sorted((c for c in range(bucket) if c not in mine), key=rank, reverse=True)  # the worst leave first
    coming = [c for c in sorted(mine) if c >= bucket]
    swaps = list(zip(coming, front))
    staying = [c for c in front[len(coming):] if rank(c) == 2]
    if staying:  # rows that would read again: trade them for better rows from behind the bucket
        taken = set(coming)
        spare = sorted((c for c in range(bucket, max_rows) if c not in taken and rank(c) < 2), key=rank)
        swaps += zip(staying, spare)
    return swaps
