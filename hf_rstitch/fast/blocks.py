"""Which KV blocks each cache row owns: a free list and per-row block lists (host logic only, no torch).

A paged cache (:mod:`.paged_kv`) stores keys and values in fixed blocks of :data:`BLOCK_TOKENS` tokens
drawn from one pool per lane. Row ``r``'s token ``t`` (its position: the count of its real columns before
it) lives in block ``blocks[r][t // BLOCK_TOKENS]`` at offset ``t % BLOCK_TOKENS``. Block :data:`TRASH` is
never handed out: every table entry without a block points at it, so writes of padding, of dead rows and
of bucket padding land there and nothing reads them.

This module decides only ownership: :class:`BlockTables` grows a row to cover a number of tokens (taking
blocks from the :class:`BlockAllocator`), moves a row's blocks to another row, and returns them when the
row leaves. It returns the table entries that changed; the cache writes them to its device table. Every
block is either free or owned by exactly one row (:meth:`BlockTables.check`).

What it does not do: sharing blocks between rows (prefix caching), eviction policy (the request engine's).
"""

from __future__ import annotations

BLOCK_TOKENS = 16  # tokens a block holds (the store and attention kernels take any power of two)
TRASH = 0  # the block every unassigned table entry points at; never allocated


class OutOfBlocks(RuntimeError):
    """The pool has fewer free blocks than a row needs (the message says how many of each)."""


def blocks_for(tokens: int, block: int = BLOCK_TOKENS) -> int:
    """Blocks that hold ``tokens`` tokens."""
    return -(-max(tokens, 0) // block)


class BlockAllocator:
    """A free list over blocks ``1 .. n_blocks - 1`` (block :data:`TRASH` is never handed out)."""

    def __init__(self, n_blocks: int):
        if n_blocks < 2:
            raise ValueError(f"a block pool needs at least 2 blocks (one is the trash block), got {n_blocks}")
        self.n_blocks = n_blocks
        self._free = list(range(n_blocks - 1, 0, -1))  # pop() hands out the lowest ids first

    @property
    def n_free(self) -> int:
        return len(self._free)

    @property
    def usable(self) -> int:
        """Blocks that can be handed out at all (all but the trash block)."""
        return self.n_blocks - 1

    def allocate(self, n: int) -> list[int]:
        """``n`` free blocks, now owned by the caller. Raises :class:`OutOfBlocks` (taking none) if fewer are free."""
        if n > len(self._free):
            raise OutOfBlocks(f"the KV pool has {len(self._free)} free blocks of {BLOCK_TOKENS} tokens, {n} are "
                              f"needed; wait for rows to finish, or build the engine with more KV memory")
        return [self._free.pop() for _ in range(n)]

    def free(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))


class BlockTables:
    """The blocks of each cache row of one cache (``rows`` rows, ``width`` table entries a row).

    Several tables may share one allocator (a lane and its one-row joiner share a pool: a joiner's
    prefilled row is handed to the lane by :meth:`take`, no copy)."""

    def __init__(self, allocator: BlockAllocator, rows: int, width: int, block: int = BLOCK_TOKENS):
        self.allocator, self.width, self.block = allocator, width, block
        self.owned: list[list[int]] = [[] for _ in range(rows)]
        self.covered: list[int] = [0] * rows  # tokens each row's blocks hold (a cheap check before grow)

    def need(self, row: int, tokens: int) -> int:
        """New blocks row ``row`` needs to hold ``tokens`` tokens."""
        return max(blocks_for(min(tokens, self.width * self.block), self.block) - len(self.owned[row]), 0)

    def grow(self, wants: dict[int, int]) -> list[tuple[int, int, int]]:
        """Give each row ``r`` of ``wants`` blocks for its first ``wants[r]`` tokens (capped at the table's
        width). All or nothing: raises :class:`OutOfBlocks` before taking any if the pool is short. Returns the
        new table entries ``(row, index, block)``."""
        needs = {r: self.need(r, t) for r, t in wants.items()}
        total = sum(needs.values())
        if total == 0:
            return []
        if total > self.allocator.n_free:
            raise OutOfBlocks(f"rows {sorted(r for r, n in needs.items() if n)} need {total} more KV blocks of "
                              f"{self.block} tokens, the pool has {self.allocator.n_free} free; wait for rows to "
                              "finish, or give the engine more KV memory")
        entries = []
        for r, n in needs.items():
            for b in self.allocator.allocate(n):
                entries.append((r, len(self.owned[r]), b))
                self.owned[r].append(b)
            self.covered[r] = len(self.owned[r]) * self.block
        return entries

    def release(self, rows) -> list[int]:
        """Return the blocks of ``rows`` to the pool; returns the rows whose table entries must be reset."""
        cleared = []
        for r in rows:
            if self.owned[r]:
                self.allocator.free(self.owned[r])
                self.owned[r], self.covered[r] = [], 0
                cleared.append(r)
        return cleared

    def move(self, src: int, dst: int) -> None:
        """Row ``src``'s blocks become row ``dst``'s (``dst`` must own none); ``src`` owns none after."""
        if self.owned[dst]:
            raise RuntimeError(f"cache row {dst} still owns {len(self.owned[dst])} blocks; release it before moving "
                               f"row {src} there")
        self.owned[dst], self.owned[src] = self.owned[src], []
        self.covered[dst], self.covered[src] = self.covered[src], 0

    def swap(self, a: int, b: int) -> None:
        """Rows ``a`` and ``b`` trade their blocks."""
        self.owned[a], self.owned[b] = self.owned[b], self.owned[a]
        self.covered[a], self.covered[b] = self.covered[b], self.covered[a]

    def take(self, other: "BlockTables", src: int, dst: int) -> None:
        """Row ``src`` of ``other`` (same allocator) becomes row ``dst`` of this table."""
        if other.allocator is not self.allocator:
            raise ValueError("rows move between block tables of one pool only")
        self.release([dst])
        self.owned[dst], other.owned[src] = other.owned[src], []
        self.covered[dst], other.covered[src] = other.covered[src], 0

    def n_owned(self) -> int:
        return sum(len(o) for o in self.owned)

    def check(self, *others: "BlockTables") -> None:
        """Assert no block is owned twice, none is both owned and free, and none is lost (``others``: every
        other table drawing from this pool)."""
        owned = [b for t in (self, *others) for o in t.owned for b in o]
        assert len(owned) == len(set(owned)), f"a block owned twice: {sorted(owned)}"
        assert TRASH not in owned, "the trash block is owned"
        free = set(self.allocator._free)
        assert len(free) == len(self.allocator._free), "a block is free twice"
        assert not free & set(owned), f"blocks both free and owned: {sorted(free & set(owned))}"
        for t in (self, *others):
            assert t.covered == [len(o) * t.block for o in t.owned], "covered tokens out of step with the blocks"
        assert len(free) + len(owned) == self.allocator.usable, \
            f"{self.allocator.usable - len(free) - len(owned)} blocks neither free nor owned"
