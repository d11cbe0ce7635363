"""Which cache row holds which live row of a batch, and the per-row accounting of a fast lane.

A CUDA graph replays fixed shapes, so a fast lane runs a batch of ``B`` rows in the graph of the
smallest batch bucket ``b >= B`` (:func:`batch_sizes`). When rows finish (``keep_rows``) the
survivors keep their cache rows and the finished ones stay in the bucket as dead weight -- their
cache rows are computed and ignored -- until the live rows fit a smaller bucket; then the few
live rows sitting above it move down into free cache rows (:meth:`RowSlots.keep` returns those
moves). Nothing is reallocated and no graph is captured again.

The live rows keep the caller's order (row ``r`` of ``seq`` is live row ``r``); ``slot[r]`` is the
cache row that holds it, so after a move the cache rows are no longer in that order and the lane
gathers / scatters through ``slot``.
"""

from __future__ import annotations

from ..core.roles import Role
from ..core.trace import ForwardCall, solo_calls
from .buckets import bucket_for


SPARE_STEP = 16  # the first batch bucket above a lane's batch when it holds spare rows (then doubling)


def batch_sizes(max_rows: int, spare: int = 0) -> tuple[int, ...]:
    """Batch buckets ``(1, 2, 4, ..., max_rows)``: powers of two below ``max_rows``, then ``max_rows``
    itself (so a batch of 48 runs in a 48-row graph, not a 64-row one). With ``spare`` of the ``max_rows`` held
    beyond the batch (cache rows for joins read as virtual rows, :mod:`.virtual_rows`): the buckets up to the batch
    ``max_rows - spare``, then the batch plus 16, 32, 64, ... spare rows up to ``max_rows`` (a call with a few
    virtual rows runs a few more rows, not all of the spare ones)."""
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise ValueError(f"a fast lane holds at least one row, got max_rows={max_rows!r}")
    if not 0 <= spare < max_rows:
        raise ValueError(f"spare rows are fewer than a lane's rows and not negative, got {spare} of {max_rows}")
    base = max_rows - spare
    sizes, size = [], 1
    while size < base:
        sizes.append(size)
        size *= 2
    sizes.append(base)
    step = SPARE_STEP
    while step < spare:
        sizes.append(base + step)
        step *= 2
    return tuple(sizes) + ((max_rows,) if spare else ())


class RowSlots:
    """Host bookkeeping of the live rows: cache row, columns a solo run would have seen, left padding."""

    def __init__(self, max_rows: int, spare: int = 0):
        self.max_rows = max_rows
        self.base = max_rows - spare  # the batch: live rows at most (the rest held for virtual rows)
        self.sizes = batch_sizes(max_rows, spare)  # the batch buckets (spare rows: a few buckets above the batch)
        self.slot: list[int] = []  # cache row of each live row
        self.solo_seen: list[int] = []  # per live row, columns a solo lane's cache would hold
        self.pad: list[int] = []  # per live row, left-padding columns of its prompt
        # per live row, columns of the shared sequence its cache row holds: the lane's ``seen`` unless the lane runs
        # only the rows a call needs (:mod:`.lane_compact`), where rows that sat a call out lag behind
        self.read: list[int] = []

    def start(self, pads: list[int]) -> None:
        if len(pads) > self.max_rows:
            raise ValueError(f"this lane holds {self.max_rows} rows, got a batch of {len(pads)}; build the engine's "
                             "lanes for the larger batch (FastEngine rebuilds them when a generation needs more rows).")
        self.slot, self.solo_seen, self.pad = list(range(len(pads))), [0] * len(pads), list(pads)
        self.read = [0] * len(pads)

    def clear(self) -> None:
        self.slot, self.solo_seen, self.pad, self.read = [], [], [], []

    @property
    def n_live(self) -> int:
        return len(self.slot)

    def free(self, below: int | None = None) -> list[int]:
        """Cache rows (below ``below``; default: all) that no live row holds, lowest first."""
        return sorted(set(range(self.max_rows if below is None else below)) - set(self.slot))

    @property
    def bucket(self) -> int:
        """Rows of the graph that runs the live rows: the smallest batch bucket holding every live cache row."""
        return bucket_for(max(self.slot) + 1, self.sizes)

    @property
    def in_order(self) -> bool:
        """Live row ``r`` sits in cache row ``r`` (no gather / scatter needed)."""
        return all(s == r for r, s in enumerate(self.slot))

    def keep(self, index: list[int], settle: bool = True) -> list[tuple[int, int]]:
        """Keep live rows ``index`` (in that order); returns the cache-row moves ``(src, dst)`` that bring
        every live row under the smallest batch bucket that holds them all (none without ``settle``: the rows stay
        in their cache rows)."""
        if any(i < 0 or i >= self.n_live for i in index):
            raise IndexError(f"keep_rows index {index} out of range for {self.n_live} live rows")
        self.slot = [self.slot[i] for i in index]
        self.solo_seen = [self.solo_seen[i] for i in index]
        self.pad = [self.pad[i] for i in index]
        self.read = [self.read[i] for i in index]
        if not self.slot or not settle:
            return []
        target = bucket_for(len(self.slot), self.sizes)
        free = self.free(target)
        moves = []
        for r, s in enumerate(self.slot):
            if s >= target:
                moves.append((s, free.pop(0)))
                self.slot[r] = moves[-1][1]
        return moves

    def records(self, role: Role, total: int, taking: list[bool], resumed: list[bool],
                seconds: float | None) -> dict[int, ForwardCall]:
        """Per taking-part row, as if it ran alone (as :meth:`hf_rstitch.decode.Lane._records`): real
        tokens read (``n_inf``) and held before (``n_kv``); the taking rows' solo view moves to ``total``."""
        calls = solo_calls(role, total, taking, self.solo_seen, self.pad, resumed, seconds)
        for r in calls:
            self.solo_seen[r] = total
        return calls
