"""The rows of a :class:`~hf_rstitch.fast.lane.FastLane`'s KV cache: a part the lane owns (``lane.kv``).

It holds the cache (static, or paged: blocks each row owns as it writes, :mod:`hf_rstitch.fast.paged_kv`), which
live row sits in which cache row (:class:`~hf_rstitch.fast.rows.RowSlots`), each cache row's left-padding count and
mask (``n_pad``, ``valid``), the columns of the shared sequence read so far (``seen``) and the live rows' order on
the device (``index``). Its verbs are the lane protocol's beyond ``advance`` (:mod:`hf_rstitch.decode.protocol`):
rows start, leave (:meth:`keep`), join (:meth:`add`), wait (:meth:`hold`), and the shared columns grow or shrink
on the left (:meth:`pad_left`, :meth:`trim_left`).

What it does not do: run the model. A joining row's earlier columns are filled by the caller's ``fill`` (the
lane's join twin, :mod:`hf_rstitch.fast.joins`).
"""

from __future__ import annotations

import torch

from ..decode.lane import left_padding
from ..decode.step import to_device
from .blocks import blocks_for
from .kv_shapes import kv_shape
from .paged_kv import BlockPool, PagedKV
from .rows import RowSlots
from .static_kv import StaticKV


class LaneRows:
    """A lane's KV cache of ``n_slots`` columns a row for ``max_rows`` rows of ``model``, and its rows' books.

    Paged with ``paged``, ``kv_blocks`` or ``kv_pool`` (a pool of ``kv_blocks`` blocks, default every row's
    capacity; or ``kv_pool``'s, shared with another lane), else static."""

    def __init__(self, model, role, capacity: int, max_rows: int, n_slots: int, paged: bool = False,
                 kv_blocks: int | None = None, kv_pool: BlockPool | None = None, spare: int = 0):
        dev = self.device = model.device
        self.role, self.capacity = role, capacity
        self.slots = RowSlots(max_rows, spare)  # live row -> cache row, per-row trace bookkeeping
        self.n_pad = torch.zeros(max_rows, dtype=torch.long, device=dev)  # left-padding columns of each cache row
        self.valid = torch.ones(max_rows, n_slots, dtype=torch.bool, device=dev)  # False on left-padding slots
        self.paged = paged or kv_blocks is not None or kv_pool is not None
        self.kv_blocks = kv_blocks  # as asked for (None: a static cache, or config.paged's full rows)
        if self.paged:
            pool = kv_pool or BlockPool(kv_shape(model), kv_blocks or 1 + max_rows * blocks_for(n_slots), model.dtype,
                                        dev)
            self.cache = PagedKV(pool, max_rows, n_slots, self.n_pad)
        else:
            self.cache = StaticKV(model.config, n_slots, model.dtype, dev, rows=max_rows, shape=kv_shape(model))
        self.seen = 0  # columns of the shared sequence in the cache (every row)
        self.index: torch.Tensor | None = None  # [B] cache row of each live row (device); None: in order
        self.row_moves = 0  # cache rows moved down when finished rows let the batch bucket shrink
        self.settle = True  # rows that stay move down when the live rows fit a smaller bucket (keep)

    @property
    def pool(self) -> BlockPool | None:
        """The :class:`~hf_rstitch.fast.paged_kv.BlockPool` of a paged cache; None: a static cache."""
        return self.cache.pool if self.paged else None

    def start(self, mask: torch.Tensor) -> None:
        """First call of a generation: note each row's left padding from ``mask`` ``[B, T]`` (one host sync)."""
        host = mask.detach().cpu().bool()  # [B, T]
        padding = left_padding(host)  # [B]
        holes = ~host & (torch.arange(host.shape[1]) >= padding[:, None])  # masked columns past a row's padding
        if bool(holes.any()):
            r = int(holes.any(1).nonzero()[0])
            raise ValueError(f"FastLane supports left padding only; row {r} of the attention mask has holes.")
        pads = padding.tolist()
        self.slots.start(pads)
        b, t = host.shape
        self.n_pad[:b].copy_(to_device(pads, self.device))
        self.valid[:b].fill_(True)
        self.valid[:b, :t].copy_(to_device(host, self.device))
        self.index = None

    def check(self, seq: torch.Tensor, mask: torch.Tensor, total: int) -> None:
        """Before a call over ``seq`` ``[B, total]``: refuse a sequence past the capacity or of other rows than the
        live ones; the first call of a generation notes the padding (:meth:`start`)."""
        if total > self.capacity:
            raise RuntimeError(
                f"{self.role} FastLane holds {self.capacity} tokens but the sequence has {total}; build it with a "
                "larger capacity (the generation's max_length) or lower max_new_tokens."
            )
        if self.seen == 0:
            self.start(mask)
        if seq.shape[0] != self.slots.n_live:
            raise ValueError(f"{self.role} FastLane holds {self.slots.n_live} live rows but got a sequence of shape "
                             f"{tuple(seq.shape)}; drop finished rows with keep_rows before advancing.")

    def reset(self) -> None:
        """Forget the sequence (a paged cache's blocks go back to its pool)."""
        if self.paged:
            self.cache.release_all()
        self.cache.pos.zero_()
        self.valid.fill_(True)
        self.n_pad.zero_()
        self.seen = self.row_moves = 0
        self.slots.clear()
        self.index = None

    def reserve(self, total: int) -> None:
        """A paged cache: every live row gets blocks for its tokens up to column ``total`` before a call writes them;
        raises :class:`~hf_rstitch.fast.blocks.OutOfBlocks`, taking none, when the pool is short."""
        if self.paged:
            self.cache.reserve_columns(total, self.slots.slot, self.slots.pad)

    def crop(self, total: int) -> None:
        """Forget the columns past ``total`` (``0 < total <= seen``; a guessed early call undone): the write offset
        moves back on the device, a position reset and no copy. The slots past it hold keys nothing reads (every
        mask and the split kernel stop at the offset) until the next call writes over them; a paged cache keeps
        the blocks it reserved for them."""
        if not 0 < total <= self.seen:
            raise ValueError(f"{self.role} lane: cannot crop to {total} columns; it has read {self.seen} (expected "
                             f"0 < total <= {self.seen}: only columns read since the last call may be forgotten).")
        if total < self.seen:
            self.cache.pos.sub_(self.seen - total)
            self.seen = total
            self.slots.read = [min(r, total) for r in self.slots.read]  # columns before total hold what they read

    def live(self, out: torch.Tensor) -> torch.Tensor:
        """Rows of a graph output ``[b, ...]`` that belong to live rows, in the caller's order."""
        return out[: self.slots.n_live] if self.index is None else out.index_select(0, self.index)

    def keep(self, index) -> None:
        """Keep only the live rows ``index`` (CPU long tensor), in that order. No buffer is reallocated: finished
        rows stay in the batch bucket as dead weight until the live ones fit a smaller bucket, then the live rows
        above it move down (a copy of their written slots). A lane whose calls gather their rows (``settle``
        False, :mod:`.lane_compact`) moves none: a leaving row's cache row is freed, to be taken by a joining row.
        Before the first call there is nothing to keep."""
        if self.seen == 0:
            return
        index = index.tolist() if isinstance(index, torch.Tensor) else [int(i) for i in index]  # not a tensor a row
        before = list(self.slots.slot)
        moves = self.slots.keep(index, settle=self.settle)
        if self.paged:  # the rows that left give their blocks back; moving rows take theirs along
            kept = {before[i] for i in index}
            self.cache.release([row for row in before if row not in kept])
            for src, dst in moves:
                self.cache.move_row(src, dst)
        if moves:
            src = to_device([m[0] for m in moves], self.device)
            dst = to_device([m[1] for m in moves], self.device)
            if not self.paged:
                self.cache.move_rows(src, dst, self.seen)
            self.valid[dst] = self.valid[src]
            self.n_pad[dst] = self.n_pad[src]
            self.row_moves += len(moves)
        self.index = None if self.slots.in_order else to_device(self.slots.slot, self.device)

    def add(self, seq: torch.Tensor, mask: torch.Tensor, fill) -> None:
        """Append rows laid out in the shared columns (``seq`` / ``mask`` ``[k, T]``, left-padded; on the host, as the
        request engine's batch passes them, nothing is read back from the device) in free cache rows;
        ``fill(free, host)`` writes their first ``seen`` columns into cache rows ``free`` (``host``: their mask on
        the CPU). Their trace records count from nothing seen, as in a solo run."""
        if self.seen == 0:  # nothing read yet: the first advance reads every row's padding from its mask
            return
        k = seq.shape[0]
        host = mask.detach().cpu().bool()
        pads = left_padding(host).tolist()
        free = self.slots.free()[:k]
        if len(free) < k:
            raise ValueError(f"{self.role} FastLane holds {self.slots.max_rows} rows, {self.slots.n_live} are live: "
                             f"no room for {k} more. Build the engine with FastEngine(max_batch=...) >= the largest "
                             "batch.")
        fill(free, host)
        dst = to_device(free, self.device)
        self.valid.index_fill_(0, dst, True)  # not valid[dst] = True: a blocking copy of the scalar (paged_kv.release)
        self.valid[dst, : host.shape[1]] = to_device(host, self.device)
        self.n_pad[dst] = to_device(pads, self.device)
        self.slots.slot += free
        self.slots.solo_seen += [0] * k
        self.slots.pad += pads
        self.slots.read += [self.seen] * k
        self.index = None if self.slots.in_order else to_device(self.slots.slot, self.device)

    def pad_left(self, n: int) -> None:
        """Prepend ``n`` masked columns to every row (the shared sequence grew on the left): the written slots move
        ``n`` to the right; positions stay (slot and padding count both grow by ``n``)."""
        if n <= 0:
            return
        if self.seen > 0:
            if self.seen + n > self.capacity:
                raise RuntimeError(f"{self.role} FastLane holds {self.capacity} tokens; padding {self.seen} columns "
                                   f"by {n} more overflows it. Build the engine with a larger capacity.")
            self._shift(n, n)
        self.slots.pad = [p + n for p in self.slots.pad]
        self.slots.solo_seen = [s + n for s in self.slots.solo_seen]

    def trim_left(self, n: int) -> None:
        """Drop the first ``n`` columns of the shared sequence, which must be padding in every row."""
        if n <= 0:
            return
        if n > min(self.slots.pad, default=n):
            raise ValueError(f"{self.role} FastLane: cannot trim {n} columns, some row has only "
                             f"{min(self.slots.pad)} of padding")
        if self.seen > 0:
            self._shift(-n, -min(n, self.seen))
        self.slots.pad = [p - n for p in self.slots.pad]
        self.slots.solo_seen = [max(s - n, 0) for s in self.slots.solo_seen]

    def hold(self, index: list[int]) -> None:
        """Live rows ``index`` gain no token this step: their written slots move one to the right (one copy over
        every layer), a masked slot in front; the last seen column is read again at the next call."""
        if not index or self.seen == 0:  # nothing written: the first call reads the padding from the mask
            return
        for i in index:  # a few rows a step: per-row copies, no index tensor to send to the device
            row = self.slots.slot[i]
            self.cache.shift_row(row, 1, self.seen)
            self.valid[row, 1:] = self.valid[row, :-1].clone()
            self.valid[row, 0] = False
            self.n_pad[row] += 1
            self.slots.pad[i] += 1
            self.slots.solo_seen[i] += 1
            # the columns it read moved right with it; a row that read every column reads its last one again
            self.slots.read[i] = min(self.slots.read[i] + 1, self.seen)

    def _shift(self, n: int, cut: int) -> None:
        """The shared columns move ``n`` to the right (``n > 0``: new masked columns in front) or ``-n`` to the
        left (leading padding dropped): the padding masks and counts of every row move by ``n``, the ``cut``
        written slots of the live cache rows by ``cut`` (``|cut| <= |n|``: only written slots exist)."""
        seen, width = self.seen, self.valid.shape[1]
        rows = self.slots.bucket if self.slots.slot else self.slots.max_rows
        if cut != 0:
            for row in range(rows):
                self.cache.shift_row(row, cut, seen + max(cut, 0))
        if n > 0:
            self.valid[:, n:] = self.valid[:, : width - n].clone()
            self.valid[:, :n] = False
        else:
            self.valid[:, : width + n] = self.valid[:, -n:].clone()
            self.valid[:, width + n:] = True
        self.n_pad.add_(n).clamp_(min=0)
        self.cache.pos.add_(cut)
        self.seen += cut
        self.slots.read = [max(r + cut, 0) for r in self.slots.read]

    def swap(self, pairs: list[tuple[int, int]]) -> None:
        """Cache rows ``a`` and ``b`` of each pair trade places (disjoint pairs), whoever holds them (a live row or
        nobody): a paged cache trades table rows and block lists (an index, no keys or values move), a static one
        copies the rows' slots. The live rows' cache rows follow (:mod:`.lane_compact` gathers a call's rows so)."""
        if not pairs:
            return
        a, b = [p[0] for p in pairs], [p[1] for p in pairs]
        src, dst = to_device(a + b, self.device), to_device(b + a, self.device)
        if self.paged:
            self.cache.swap_rows(src, dst, pairs)
        else:
            self.cache.states[:, :, dst] = self.cache.states[:, :, src]
        self.valid[dst] = self.valid[src]
        self.n_pad[dst] = self.n_pad[src]
        moved = {**dict(zip(a, b)), **dict(zip(b, a))}
        self.slots.slot = [moved.get(s, s) for s in self.slots.slot]
        self.index = None if self.slots.in_order else to_device(self.slots.slot, self.device)
