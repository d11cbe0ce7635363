"""Continuous batching for :class:`~hf_rstitch.fast.lane.FastLane`: rows join, wait, leave, and the shared columns
grow or shrink on the left (the verbs of the lane protocol beyond ``advance``, :mod:`hf_rstitch.decode.protocol`);
with a paged cache, the blocks each row owns follow it (:mod:`hf_rstitch.fast.paged_kv`).

A mixin over the lane's state: its static cache (``cache``), per-cache-row padding mask and count
(``valid``, ``n_pad``), row bookkeeping (``rows``), columns read so far (``seen``) and the live-row order
on the device (``_slot_index``).
"""

from __future__ import annotations

import dataclasses

import torch

from ..decode.lane import left_padding
from ..decode.step import to_device
from . import joins


class RowOps:
    """``keep_rows``, ``add_rows``, ``pad_left``, ``trim_left`` and ``hold_rows`` of a FastLane."""

    def keep_rows(self, index: torch.Tensor) -> None:
        """Keep only the live rows ``index`` (CPU long tensor), in that order. No buffer is reallocated:
        finished rows stay in the batch bucket as dead weight until the live ones fit a smaller bucket,
        then the live rows above it move down (a copy of their written slots). Before the lane's first
        call there is nothing to keep: that call starts from the rows it is given."""
        if self.seen == 0:
            return
        index = [int(i) for i in index]
        before = list(self.rows.slot)
        moves = self.rows.keep(index)
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
        in_order = self.rows.in_order
        self._slot_index = None if in_order else to_device(self.rows.slot, self.device)

    def add_rows(self, seq: torch.Tensor, mask: torch.Tensor, staged: list[int] | None = None) -> None:
        """Append rows laid out in the shared columns (``seq`` / ``mask`` ``[k, T]``, left-padded) in free
        cache rows. Their first ``seen`` columns are prefilled now, all the step's joining rows together (logits
        discarded, as :meth:`hf_rstitch.decode.Lane.add_rows`), or, with ``staged``, copied from these rows of
        the stage (:meth:`stage_rows`, read to the end); the rest is read at the next :meth:`advance`. Their
        trace records count from nothing seen, as in a solo run."""
        if self.seen == 0:  # nothing read yet: the first advance reads every row's padding from its mask
            return
        k = seq.shape[0]
        host = mask.detach().cpu().bool()
        pads = left_padding(host).tolist()
        free = sorted(set(range(self.max_rows)) - set(self.rows.slot))[:k]
        if len(free) < k:
            raise ValueError(f"{self.role} FastLane holds {self.max_rows} rows, {self.rows.n_live} are live: no room "
                             f"for {k} more. Build the engine with FastEngine(max_batch=...) >= the largest batch.")
        if staged is None:
            self._prefill_rows(free, seq[:, : self.seen], host[:, : self.seen])
        else:
            self._stage.copy_into(self, free, staged, seq.shape[1])
        dst = to_device(free, self.device)
        self.valid[dst] = True
        self.valid[dst, : host.shape[1]] = to_device(host, self.device)
        self.n_pad[dst] = to_device(pads, self.device)
        self.rows.slot += free
        self.rows.solo_seen += [0] * k
        self.rows.pad += pads
        self._slot_index = None if self.rows.in_order else to_device(self.rows.slot, self.device)

    # ---- chunked joins: prompts read over several steps before their rows join (fast/joins.py) ----------------
    @property
    def stage_room(self) -> int:
        """Prompts one stage holds (the join twin's rows)."""
        return min(self.max_rows, joins.JOIN_ROWS)

    def stage_rows(self, prompts: list[list[int]]) -> None:
        """Lay out joining prompts (at most :attr:`stage_room`) in the join twin, to be read over several steps
        (:meth:`prefill_staged`) while the batch decodes; they join with ``add_rows(..., staged=...)``."""
        if len(prompts) > self.stage_room:
            raise ValueError(f"{self.role} FastLane stages {self.stage_room} prompts at once, got {len(prompts)}")
        self._stage = joins.Stage(self._joiner(), prompts)

    def prefill_staged(self, budget: int) -> bool:
        """Read the staged prompts' next chunk (at most ``budget`` tokens, rows x columns); True once every
        prompt but its last token is read."""
        return self._stage.advance(budget)

    def unstage(self) -> None:
        """Forget the stage (its rows joined, or its requests went back to waiting)."""
        self._stage = None

    def pad_left(self, n: int) -> None:
        """Prepend ``n`` masked columns to every row (the shared sequence grew on the left): the written
        slots move ``n`` to the right; positions stay (slot and padding count both grow by ``n``)."""
        if n <= 0:
            return
        if self.seen > 0:
            if self.seen + n > self.capacity:
                raise RuntimeError(f"{self.role} FastLane holds {self.capacity} tokens; padding {self.seen} columns "
                                   f"by {n} more overflows it. Build the engine with a larger capacity.")
            self._shift(n, n)
        self.rows.pad = [p + n for p in self.rows.pad]
        self.rows.solo_seen = [s + n for s in self.rows.solo_seen]

    def trim_left(self, n: int) -> None:
        """Drop the first ``n`` columns of the shared sequence, which must be padding in every row."""
        if n <= 0:
            return
        if n > min(self.rows.pad, default=n):
            raise ValueError(f"{self.role} FastLane: cannot trim {n} columns, some row has only "
                             f"{min(self.rows.pad)} of padding")
        if self.seen > 0:
            self._shift(-n, -min(n, self.seen))
        self.rows.pad = [p - n for p in self.rows.pad]
        self.rows.solo_seen = [max(s - n, 0) for s in self.rows.solo_seen]

    def hold_rows(self, index: list[int]) -> None:
        """As :meth:`hf_rstitch.decode.Lane.hold_rows`: live rows ``index`` gain no token this step; their
        written slots move one to the right (one copy over every layer), a masked slot in front, and the
        last seen column is read again at the next call."""
        if not index or self.seen == 0:  # nothing written: the first call reads the padding from the mask
            return
        for i in index:  # a few rows a step: per-row copies, no index tensor to send to the device
            row = self.rows.slot[i]
            self.cache.shift_row(row, 1, self.seen)
            self.valid[row, 1:] = self.valid[row, :-1].clone()
            self.valid[row, 0] = False
            self.n_pad[row] += 1
            self.rows.pad[i] += 1
            self.rows.solo_seen[i] += 1


    @property
    def kv_pool(self):
        """The :class:`~hf_rstitch.fast.paged_kv.BlockPool` of a paged cache (its ``allocator`` says how many blocks
        are free); None: a static cache."""
        return self.cache.pool if self.paged else None

    # ---- internals ----------------------------------------------------------------------------
    def _reserve(self, total: int) -> None:
        """A paged cache: every live row gets blocks for its tokens up to column ``total`` (the columns this call
        writes) before the call runs; raises :class:`~hf_rstitch.fast.blocks.OutOfBlocks`, taking none, when the
        pool is short. A static cache holds every slot already."""
        if self.paged:
            self.cache.reserve_columns(total, self.rows.slot, self.rows.pad)

    def _prefill_rows(self, dst: list[int], ids: torch.Tensor, host: torch.Tensor) -> None:
        """Fill cache rows ``dst`` with the keys/values of ``ids`` ``[k, seen]`` (``host``: their mask, bool, on
        the CPU): every joining row of the step together, in batched calls of this lane's join twin
        (:func:`hf_rstitch.fast.joins.prefill_rows`), then one copy of each row's slots into this cache.

        Why not an eager forward: on a GPU that one forward per lane is host-bound, about ten decode steps'
        worth a joining row (``benchmarks/results/request_engine_*.md``)."""
        self.join_groups += joins.prefill_rows(self, dst, ids, host)

    def _joiner(self):
        """A lane of the same model and configuration with up to :data:`~hf_rstitch.fast.joins.JOIN_ROWS` rows
        (built on first use, kept): it prefills joining rows. It shares this lane's product plan (no second copy
        of the fused q/k/v weights) and the process's compiled pieces; its cache holds its rows (a paged lane's joiner
        draws on this lane's pool and hands its blocks over)."""
        if self._join_lane is None:
            rows = min(self.max_rows, joins.JOIN_ROWS)
            lane = type(self)(self.model, self.role, self.vocab, self.capacity,
                              dataclasses.replace(self.config, gemv=False), max_rows=rows,
                              kv_pool=self.kv_pool)
            lane.gemv_layers = self.gemv_layers
            lane.plan = dataclasses.replace(lane.plan, products=self.plan.products, gemv_tiers=self.plan.gemv_tiers,
                                            fuse_qkv=self.plan.fuse_qkv, fuse_mlp=self.plan.fuse_mlp)
            self._join_lane = lane
        return self._join_lane

    def _shift(self, n: int, cut: int) -> None:
        """The shared columns move ``n`` to the right (``n > 0``: new masked columns in front) or ``-n`` to the
        left (leading padding dropped): the padding masks and counts of every row move by ``n``, the
        ``cut`` written slots of the live cache rows by ``cut`` (``|cut| <= |n|``: only written slots exist)."""
        seen, width = self.seen, self.valid.shape[1]
        rows = self.rows.bucket if self.rows.slot else self.max_rows
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
