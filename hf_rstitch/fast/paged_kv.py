"""A paged KV cache: the verbs of :class:`~hf_rstitch.fast.static_kv.StaticKV` over blocks that rows own.

Why: a static cache reserves every row's whole budget (``rows x capacity`` slots) when the lane is built, so
a server must cap prompt + ``max_tokens`` to what ``max_batch`` slabs fit. Here keys and values live in a
pool of fixed blocks (:class:`BlockPool`, :data:`~.blocks.BLOCK_TOKENS` tokens each); a row owns the blocks
of the tokens it has written (:mod:`.blocks`), so memory follows the tokens written and a row that leaves
returns its blocks at once.

Layout: the lane's logical slot ``j`` of cache row ``r`` (column ``j`` of the shared sequence) is the row's
token ``t = j - pad[r]`` (its position: ``pad`` is the row's left-padding count, the lane's ``n_pad``), which
lives in block ``table[r, t // BLOCK]`` at offset ``t % BLOCK``. Slots left of the padding and table
entries with no block go to the trash block (:data:`~.blocks.TRASH`), which nothing reads. Since a row's
data is addressed relative to its padding, the lane's column moves cost nothing here: padding a row on the
left (``pad_left``, ``hold_rows``) or trimming it only changes ``pad`` (:meth:`PagedKV.shift_row` is a
no-op), rows moving down a batch bucket move their table rows, and a joining row prefilled by the lane's
one-row twin (which shares the pool) is handed over without a copy (:meth:`PagedKV.copy_rows`).

The block table is a device tensor of fixed shape ``[rows, width]`` written in place, so CUDA graphs
captured once stay valid; the host grows it (:meth:`PagedKV.reserve`) before each call for the tokens
the call writes. Writes go through the Triton store kernels (:mod:`.rope_store`, paged addressing) or
``index_put_``; attention reads the blocks in the split kernel (:mod:`.decode_attention`, ``table=``) or,
for the eager attentions, from a gathered ``[b, H_kv, slots, D]`` copy (:attr:`PagedKV.gather`; CPU tests
and GPUs without Triton).
"""

from __future__ import annotations

import torch

from ..decode.step import to_device
from .blocks import BLOCK_TOKENS, TRASH, BlockAllocator, BlockTables, blocks_for


class BlockPool:
    """Keys and values of one model in ``n_blocks`` blocks: ``states`` ``[2, layers, n_blocks, H_kv, BLOCK, D]``
    (per-layer views ``keys[l]`` / ``values[l]`` ``[n_blocks, H_kv, BLOCK, D]``) and their allocator."""

    def __init__(self, shape: tuple[int, int, int], n_blocks: int, dtype: torch.dtype, device: torch.device,
                 block: int = BLOCK_TOKENS):
        layers, kv_heads, head_dim = shape
        self.block = block
        self.allocator = BlockAllocator(n_blocks)
        self.states = torch.zeros((2, layers, n_blocks, kv_heads, block, head_dim), dtype=dtype, device=device)
        self.keys = list(self.states[0].unbind(0))
        self.values = list(self.states[1].unbind(0))

    @property
    def n_blocks(self) -> int:
        return self.allocator.n_blocks

    def nbytes(self) -> int:
        return self.states.numel() * self.states.element_size()


class PagedKV:
    """Rows over a :class:`BlockPool`: ``rows`` cache rows of ``n_slots`` logical slots each.

    Args:
        pool: where the blocks live (a lane's one-row joiner shares its lane's pool).
        rows: cache rows; n_slots: logical slots a row (the lane's capacity plus its largest bucket).
        pad: the lane's ``[rows]`` left-padding counts (device long tensor, read by every write and read).
    """

    def __init__(self, pool: BlockPool, rows: int, n_slots: int, pad: torch.Tensor):
        self.pool, self.pad, self.n_slots = pool, pad, n_slots
        device = pool.states.device
        self.tables = BlockTables(pool.allocator, rows, blocks_for(n_slots, pool.block), pool.block)
        self.table = torch.full((rows, self.tables.width), TRASH, dtype=torch.int32, device=device)
        self.pos = torch.zeros((), dtype=torch.long, device=device)  # slots written so far (as StaticKV)
        self.slots: torch.Tensor | None = None  # [q] slots the current forward writes
        self.slot_ids = torch.arange(n_slots, device=device)
        self.fused_store = False  # update() writes through the Triton store kernels (set by the lane)
        self.gather = True  # update() returns each row's slots gathered (eager attentions); False: the pool layer
        self.pending = None  # a rotation put off until update() (rope_store.Pending)

    @property
    def keys(self) -> list[torch.Tensor]:
        return self.pool.keys

    @property
    def values(self) -> list[torch.Tensor]:
        return self.pool.values

    @property
    def head_dim(self) -> int:
        return self.pool.keys[0].shape[3]

    @property
    def n_rows(self) -> int:
        return self.table.shape[0]

    def nbytes(self) -> int:
        return self.pool.nbytes() + self.table.numel() * self.table.element_size()

    def get_seq_length(self, layer_idx: int = 0) -> torch.Tensor:
        return self.pos

    # ---- blocks ------------------------------------------------------------------------------
    def reserve(self, wants: dict[int, int]) -> None:
        """Cache row ``r`` of ``wants`` gets blocks for its first ``wants[r]`` tokens (all or none: raises
        :class:`~.blocks.OutOfBlocks` taking none). One device write when some row crossed a block."""
        entries = self.tables.grow(wants)
        if entries:  # queued behind a step run ahead, not waiting for it (to_device)
            rows, index, blocks = to_device(torch.tensor(entries, dtype=torch.long).T, self.table.device)
            self.table.index_put_((rows, index), blocks.to(torch.int32))

    def reserve_columns(self, total: int, rows: list[int], pads: list[int]) -> None:
        """:meth:`reserve` for cache rows ``rows`` (left padding ``pads``) up to column ``total``: a row's tokens are
        the columns past its padding. Rows whose blocks already hold them cost one comparison."""
        covered = self.tables.covered
        wants = {r: total - p for r, p in zip(rows, pads) if total - p > covered[r]}
        if wants:
            self.reserve(wants)

    def release(self, rows) -> None:
        """Cache rows ``rows`` give their blocks back; their table entries point at the trash block again."""
        cleared = self.tables.release(rows)
        if cleared:
            # index_fill_, not ``table[rows] = TRASH``: torch stages an indexed assignment's Python scalar on the
            # host and copies it over blocking, which waits for every kernel queued (a step run ahead)
            self.table.index_fill_(0, to_device(cleared, self.table.device), TRASH)

    def release_all(self) -> None:
        self.release(range(self.n_rows))

    def move_row(self, src: int, dst: int) -> None:
        """Cache row ``src``'s blocks become row ``dst``'s (``dst`` owns none)."""
        self.tables.move(src, dst)
        self.table[dst] = self.table[src]
        self.table[src] = TRASH

    def swap_rows(self, src: torch.Tensor, dst: torch.Tensor, pairs: list[tuple[int, int]]) -> None:
        """Cache rows of each pair ``(a, b)`` trade their blocks (``src``/``dst``: the pairs' rows as device
        indices, ``a`` then ``b`` and ``b`` then ``a``)."""
        for a, b in pairs:
            self.tables.swap(a, b)
        self.table[dst] = self.table[src]

    def copy_rows(self, other: "PagedKV", src: list[int], dst: list[int], n_slots: int) -> None:
        """Rows ``src`` of ``other`` (another cache over the same pool) become rows ``dst`` of this cache: their
        blocks are handed over, not copied (``other``'s rows own none after). ``n_slots``: unused (every block
        moves). Several rows in three device operations (a join's rows, handed over together); one row in two."""
        if len(src) != len(dst) or len(set(src)) < len(src) or len(set(dst)) < len(dst) or other is self:
            raise ValueError(f"copy_rows hands distinct rows of another cache to as many distinct rows, got {src} "
                             f"-> {dst}{' within one cache' if other is self else ''}")
        if len(src) == 1:
            self.copy_row(other, src[0], dst[0], n_slots)
            return
        for s, d in zip(src, dst):
            self.tables.take(other.tables, s, d)
        index = to_device(list(src) + list(dst), self.table.device)  # one copy, queued behind a step run ahead
        src_t, dst_t = index[:len(src)], index[len(src):]
        self.table.index_copy_(0, dst_t, other.table.index_select(0, src_t))
        other.table.index_fill_(0, src_t, TRASH)  # not table[src] = TRASH (see release)

    def copy_row(self, other: "PagedKV", src: int, dst: int, n_slots: int) -> None:
        """Row ``src`` of ``other`` (a cache over the same pool) becomes row ``dst`` of this cache (:meth:`copy_rows`
        of one row: two device operations, no index to copy over)."""
        self.tables.take(other.tables, src, dst)
        self.table[dst] = other.table[src]
        other.table[src] = TRASH

    def copy_slots(self, other: "PagedKV", src: int, src_start: int, dst: int, dst_start: int, n: int) -> None:
        """Slots ``[src_start, src_start + n)`` of ``other``'s row ``src`` to ``[dst_start, dst_start + n)`` of row
        ``dst`` (a staged join, :class:`hf_rstitch.fast.joins.Stage`): both ranges start at their row's padding, so
        they are the same tokens ``[0, n)`` and the blocks are handed over (tokens past ``n`` the lane reads itself)."""
        self.copy_row(other, src, dst, n)

    def shift_row(self, row: int, by: int, n_slots: int) -> None:
        """Nothing to move: a row's tokens are addressed from its padding count, which the lane shifts."""

    # ---- transformers' cache verb --------------------------------------------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        # key_states: [b, H_kv, q, D] -> slots[0..q) of rows [0, b); returns what the lane's attention reads
        b = key_states.shape[0]
        keys, values = self.pool.keys[layer_idx], self.pool.values[layer_idx]
        pending, self.pending = self.pending, None
        table, pad = self.table[:b], self.pad[:b]
        if pending is not None:
            if pending.k is not key_states:
                raise RuntimeError(f"layer {layer_idx} stored other keys than it rotated; this model's attention "
                                   "code is not the one the fast engine's deferred rotation supports. Build the lane "
                                   "with FastConfig(fuse_rope_store=False).")
            pending.store(key_states, value_states, self.slots, keys, values, table, pad)
        elif self.fused_store:
            torch.ops.hf_rstitch.store_kv(key_states, value_states, self.slots, keys, values, table, pad)
        else:
            block, offset = self.locate(b, self.slots)  # [b, q] each
            keys[block, :, offset] = key_states.transpose(1, 2).to(keys.dtype)  # [b, q, H_kv, D]
            values[block, :, offset] = value_states.transpose(1, 2).to(values.dtype)
        if not self.gather:
            return keys, values
        block, offset = self.locate(b, self.slot_ids)  # [b, S]
        return keys[block, :, offset].transpose(1, 2), values[block, :, offset].transpose(1, 2)  # [b, H_kv, S, D]

    def locate(self, b: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Block and offset ``[b, n]`` of logical ``slots`` ``[n]`` in cache rows ``[0, b)`` (the trash block
        left of a row's padding)."""
        token = slots[None, :] - self.pad[:b, None]  # [b, n] the row's token index
        inside = token >= 0
        token = token.clamp(min=0)
        block = self.table[:b].long().gather(1, token // self.pool.block)
        return torch.where(inside, block, TRASH), token % self.pool.block
