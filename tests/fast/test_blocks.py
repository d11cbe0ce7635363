"""Block ownership of the paged KV cache (hf_rstitch.fast.blocks): hand values, then random programs of grows,
moves, hand-overs and releases that never lose, share or double-free a block."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_rstitch.fast.blocks import TRASH, BlockAllocator, BlockTables, OutOfBlocks, blocks_for


def test_blocks_for():
    assert [blocks_for(n, 16) for n in (0, 1, 15, 16, 17, 32, 33)] == [0, 1, 1, 1, 2, 2, 3]


def test_allocator_never_hands_out_the_trash_block_and_refuses_beyond_its_free_count():
    pool = BlockAllocator(4)
    assert pool.usable == 3 and pool.n_free == 3
    got = pool.allocate(3)
    assert sorted(got) == [1, 2, 3] and TRASH not in got
    with pytest.raises(OutOfBlocks, match="0 free blocks of 16 tokens, 1 are needed"):
        pool.allocate(1)
    pool.free(got[:2])
    assert pool.n_free == 2
    with pytest.raises(ValueError, match="at least 2 blocks"):
        BlockAllocator(1)


def test_grow_is_all_or_nothing_and_returns_the_new_entries():
    tables = BlockTables(BlockAllocator(6), rows=3, width=4, block=4)
    assert tables.grow({0: 5, 1: 1}) == [(0, 0, 1), (0, 1, 2), (1, 0, 3)]
    assert tables.grow({0: 8}) == []  # 8 tokens: still two blocks
    with pytest.raises(OutOfBlocks, match=r"rows \[0, 2\] need 3 more KV blocks of 4 tokens, the pool has 2 free"):
        tables.grow({0: 9, 2: 7})
    assert tables.allocator.n_free == 2 and tables.owned[2] == []  # none taken
    assert tables.grow({2: 8}) == [(2, 0, 4), (2, 1, 5)]
    tables.check()


def test_width_caps_a_row():
    tables = BlockTables(BlockAllocator(20), rows=1, width=2, block=4)
    assert len(tables.grow({0: 50})) == 2


def test_move_take_and_release():
    pool = BlockAllocator(10)
    lane, joiner = BlockTables(pool, rows=3, width=8, block=4), BlockTables(pool, rows=1, width=8, block=4)
    lane.grow({0: 6})
    joiner.grow({0: 9})
    lane.take(joiner, 0, 2)
    assert lane.owned[2] == [3, 4, 5] and joiner.owned[0] == []
    lane.move(2, 1)
    assert lane.owned[1] == [3, 4, 5] and lane.owned[2] == []
    with pytest.raises(RuntimeError, match="still owns 2 blocks"):
        lane.move(1, 0)
    assert lane.release([0, 2]) == [0]
    lane.check(joiner)
    assert pool.n_free == 9 - 3
    with pytest.raises(ValueError, match="one pool"):
        lane.take(BlockTables(BlockAllocator(3), rows=1, width=1), 0, 0)


ops = st.lists(st.tuples(st.sampled_from(["grow", "release", "move", "take"]), st.integers(0, 3),
                         st.integers(0, 3), st.integers(0, 40)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(n_blocks=st.integers(2, 24), program=ops)
def test_no_block_is_lost_shared_or_freed_twice(n_blocks, program):
    pool = BlockAllocator(n_blocks)
    lane, joiner = BlockTables(pool, rows=4, width=3, block=4), BlockTables(pool, rows=4, width=3, block=4)
    for verb, a, b, tokens in program:
        if verb == "grow":
            before = pool.n_free
            try:
                new = lane.grow({a: tokens, b: tokens // 2})
            except OutOfBlocks:
                assert pool.n_free == before  # all or nothing
            else:
                assert pool.n_free == before - len(new)
                assert all(len(lane.owned[r]) <= lane.width for r in range(4))
        elif verb == "release":
            lane.release([a])
            assert lane.owned[a] == []
        elif verb == "move" and a != b and not lane.owned[b]:
            blocks = list(lane.owned[a])
            lane.move(a, b)
            assert lane.owned[b] == blocks and lane.owned[a] == []
        elif verb == "take":
            try:
                joiner.grow({0: tokens})
            except OutOfBlocks:
                pass
            lane.take(joiner, 0, a)
        lane.check(joiner)
        assert pool.n_free + lane.n_owned() + joiner.n_owned() == pool.usable
    lane.release(range(4))
    joiner.release(range(4))
    assert pool.n_free == pool.usable
