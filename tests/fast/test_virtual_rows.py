"""Joins read as virtual rows (``FastConfig(virtual_joins=V)``, :mod:`hf_rstitch.fast.virtual_rows`).

First the property of the paged cache the design relies on: a row's token ``t`` lives where its block table and its
padding count put it (``t = column - pad``), whichever cache row reads it. So a one-column call whose extra cache rows
copy a joiner's block-table row, each with the padding count that puts the call's column on one of the joiner's
prompt tokens, reads the whole prompt in that call: the joiner's last token gets the logits, and its keys and values
equal those of the prompt's prefill (every row of a layer stores before it attends, so the prompt's tokens see each
other causally). On the CPU in fp64 (eager attention; under Triton's interpreter, as the kernel tier runs it, the
cache's store kernel too), on CUDA in fp32 through the split attention and store kernels.

Then the lane's part on it: logits and caches equal the join twin's through calls of one to five columns, rows
leaving, moving, waiting, the columns trimmed and padded, block edges, failures and the fallbacks to the twin."""

import dataclasses

import pytest
import torch
from lane_batch import Batch
from tiny_models import make_pair, prompt

from hf_rstitch import Role
from hf_rstitch.fast import FastConfig, FastLane
from hf_rstitch.fast.blocks import TRASH
from hf_rstitch.fast.virtual_rows import WIDEST

CONFIG = FastConfig(max_bucket=16, graphs=False, paged=True)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE, ATOL = (torch.float32, 1e-4) if DEVICE == "cuda" else (torch.float64, 1e-12)


def _lane(llm) -> FastLane:
    return FastLane(llm, Role.LLM, 96, capacity=64, config=CONFIG, max_rows=16, kv_blocks=64)


def _row_kv(lane: FastLane, n: int) -> torch.Tensor:
    """Every layer's keys and values of cache row 0's first ``n`` tokens ``[2, layers, H_kv, n, D]`` (what the row
    holds; slots past its length, in blocks it has not reserved, are scratch that any padded write may touch)."""
    blocks = lane.cache.table[0].long()

    def tokens(pool):  # [n_blocks, H_kv, BLOCK, D] a layer -> [H_kv, n, D]
        return torch.stack([t[blocks].permute(1, 0, 2, 3).flatten(1, 2)[:, :n] for t in pool])

    return torch.stack([tokens(lane.cache.keys), tokens(lane.cache.values)])


@pytest.mark.cuda
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_a_prompt_read_as_virtual_rows_of_one_column_equals_its_prefill(arch):
    llm, _ = make_pair(arch)
    llm = llm.to(DEVICE, DTYPE)
    ids = prompt(9, seed=5)[0].to(DEVICE)
    n = ids.shape[0]
    whole = torch.ones(1, n, dtype=torch.long, device=DEVICE)

    ref = _lane(llm)
    ref.start(whole)
    ref.reserve(n)
    with torch.no_grad(), ref.model_code():  # the lane's kernels (split attention, store), as its calls run them
        want = ref.forward(ids[None], n, False)[0][0]

    lane = _lane(llm)  # row 0 reads its last token at column n - 1; rows 1..n-1 its tokens 0..n-2 there
    lane.start(whole)
    lane.reserve(n)
    column = n - 1
    lane.cache.table[1:n] = lane.cache.table[0]  # the virtual rows' blocks are row 0's
    lane.cache.pos.fill_(column)
    lane.n_pad[1:n] = torch.tensor([column - t for t in range(n - 1)], device=DEVICE)  # column - pad: its token
    lane.valid[:n] = torch.arange(lane.valid.shape[1], device=DEVICE)[None, :] >= lane.n_pad[:n, None]
    with torch.no_grad(), lane.model_code():
        got = lane.forward(torch.cat([ids[-1:], ids[:-1]])[:, None], 1, False)[0]

    torch.testing.assert_close(got[0], want, rtol=0, atol=ATOL)
    torch.testing.assert_close(_row_kv(lane, n), _row_kv(ref, n), rtol=0, atol=ATOL)


# ---- the feature on it: FastConfig(virtual_joins=V) reads joining rows' prompts in the lane's next call ----------
VIRTUAL = FastConfig(max_bucket=4, graphs=False, paged=True, virtual_joins=64)


def _kv_of(lane: FastLane, row: int, n: int) -> torch.Tensor:
    """Keys and values of cache row ``row``'s first ``n`` tokens, every layer ``[2, layers, H_kv, n, D]``."""
    blocks = lane.cache.table[row].long()
    return torch.stack([torch.stack([t[blocks].permute(1, 0, 2, 3).flatten(1, 2)[:, :n] for t in pool])
                        for pool in (lane.cache.keys, lane.cache.values)])


def _script(lane: FastLane, llm) -> list:
    """Rows join and leave a lane as a request engine's would; each call's logits (on the CPU in fp64 checked against
    each row's plain forward alone: ``Batch.check``), and the live rows' caches at the end."""
    b = Batch(lane, seed=3)
    out = []

    def step(n: int) -> None:
        out.append(b.append(n)[0])
        if DEVICE == "cpu":  # fp64: each row's logits equal its plain forward alone (fp32 on CUDA: the twin's, below)
            b.check(out[-1], llm)

    b.join([5, 3])
    step(1)
    step(2)
    b.join([4, 2])  # within the 8 columns read: the next one-column call reads both prompts as 6 virtual rows
    step(1)
    b.join([11])  # longer than the shared columns: the lane pads left, then 11 virtual rows
    step(1)
    step(3)
    b.join([3])  # the next call reads two columns: the prompt in chunks of two, the first left-padded (2 rows)
    step(2)
    b.join([7, 1])  # three columns, in the length bucket of four: chunks of four tokens (2 + 1 rows), the live rows
    step(3)  # right-padded
    b.join([2])  # five columns, past virtual_rows.WIDEST (and max_bucket: two calls): the join twin prefills it
    step(5)
    b.keep([0, 2, 3, 4, 6, 8])
    b.join([6, 2, 2])  # rows joining freed cache rows: 10 virtual rows
    step(1)
    lengths = b.mask.sum(1).tolist()
    kv = [_kv_of(lane, row, n - 1) for row, n in zip(lane.rows.slot, lengths)]  # the last token: the next call's
    return out, kv


@pytest.mark.cuda
@pytest.mark.parametrize("graphs", [False, pytest.param(True, marks=pytest.mark.skipif(
    DEVICE != "cuda", reason="CUDA graphs need CUDA"))])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_joins_read_as_virtual_rows_equal_the_join_twins_prefill(arch, graphs):
    """Equal logits and caches; on CUDA also with the calls replayed as CUDA graphs (the buffers a graph reads in
    place: ids, block table, padding counts and masks)."""
    llm, _ = make_pair(arch)
    llm = llm.to(DEVICE, DTYPE)
    runs = {}
    for budget in (64, 0):
        config = dataclasses.replace(VIRTUAL, virtual_joins=budget, graphs=graphs)
        lane = FastLane(llm, Role.LLM, 96, capacity=64, config=config, max_rows=32, kv_blocks=160)
        runs[budget] = _script(lane, llm), lane.virtual.calls, lane.virtual.rows, lane.join_groups
    ((got, got_kv), calls, rows, groups), ((want, want_kv), none, _, twin_groups) = runs[64], runs[0]
    assert (calls, rows, none) == (5, 6 + 11 + 2 + 3 + 10, 0)
    assert groups == 1 < twin_groups  # the five-column call's join took the twin
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=ATOL)
    for g, w in zip(got_kv, want_kv):
        torch.testing.assert_close(g, w, rtol=0, atol=ATOL)


def test_joins_past_the_budget_or_the_free_rows_take_the_join_twin():
    llm, _ = make_pair("llama")  # on the CPU in fp64 (each row's logits to its plain forward)
    lane = FastLane(llm.double(), Role.LLM, 96, capacity=64, config=dataclasses.replace(VIRTUAL, virtual_joins=4),
                    max_rows=4, kv_blocks=64)
    b = Batch(lane, seed=1)
    b.join([3])
    b.append(2)
    b.join([6])  # six tokens to read before the next call: past the budget of four
    b.check(b.append(1)[0], llm)
    assert (lane.virtual.calls, lane.join_groups) == (0, 1)
    b.join([2, 1])  # three tokens, two free cache rows of four
    b.check(b.append(1)[0], llm)
    assert (lane.virtual.calls, lane.join_groups) == (0, 2)
    b.keep([0, 1])
    b.join([2, 1])  # three tokens, but as many free cache rows as joiners
    b.check(b.append(1)[0], llm)
    assert (lane.virtual.calls, lane.join_groups) == (0, 3)
    b.keep([0])
    b.join([2])  # two tokens, two free cache rows
    b.check(b.append(1)[0], llm)
    assert (lane.virtual.calls, lane.virtual.rows, lane.join_groups) == (1, 2, 3)
    free = sorted(set(range(4)) - set(lane.rows.slot))
    assert bool((lane.cache.table[free] == TRASH).all())  # the virtual rows' tables point at the trash again


def test_virtual_joins_is_refused_unless_a_count():
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="virtual_joins must be an integer >= 0"):
            FastConfig(virtual_joins=bad)


def test_a_kept_join_prefilled_before_a_wider_call_gets_that_calls_blocks():
    """The join twin hands its blocks over before a call past ``max_bucket`` reserves its own: the call's tokens past
    the prompt's last block (here 15 tokens, then 5 more across the 16-token block edge) land in blocks, not the
    trash."""
    llm, _ = make_pair("llama")  # on the CPU in fp64 (each row's logits to its plain forward)
    lane = FastLane(llm.double(), Role.LLM, 96, capacity=64, config=VIRTUAL, max_rows=4, kv_blocks=32)
    b = Batch(lane, seed=2)
    b.join([3])
    b.append(14)
    b.join([15])  # within the 17 columns read: kept for the next call, which reads five (max_bucket: four)
    b.check(b.append(5)[0], llm)
    b.check(b.append(1)[0], llm)
    assert (lane.virtual.calls, lane.join_groups) == (0, 1)
    lane.cache.tables.check(lane.joins.built.cache.tables)
    assert lane.cache.tables.covered[lane.rows.slot[1]] >= 15 + 5 + 1


def test_a_wide_call_reads_joins_in_chunks_of_its_length_bucket_across_a_block_edge():
    """A three-column call (length bucket four) after a 15-token join: four chunk rows, the first left-padded by one;
    the call's columns then cross the joiner's 16-token block edge; logits equal each row's plain forward."""
    llm, _ = make_pair("qwen2")
    lane = FastLane(llm.double(), Role.LLM, 96, capacity=64, config=VIRTUAL, max_rows=12, kv_blocks=32)
    b = Batch(lane, seed=6)
    b.join([3])
    b.append(14)
    b.join([15, 6])
    b.check(b.append(3)[0], llm)
    assert (lane.virtual.calls, lane.virtual.rows, lane.join_groups) == (1, 4 + 2, 0)
    b.check(b.append(1)[0], llm)
    assert lane.cache.tables.covered[lane.rows.slot[1]] >= 15 + 3 + 1


def test_a_call_with_virtual_rows_runs_in_the_smallest_bucket_that_holds_them():
    llm, _ = make_pair("llama")
    lane = FastLane(llm.double(), Role.LLM, 96, capacity=64, config=VIRTUAL, max_rows=4 + 64, kv_blocks=64,
                    spare_rows=64)
    assert lane.rows.sizes == (1, 2, 4, 20, 36, 68)
    buckets, place = [], lane.inputs.place
    lane.inputs.place = lambda *a: (buckets.append(a[-1][0] if a[-1] is not None else a[1]), place(*a))[1]
    b = Batch(lane, seed=4)
    b.join([3, 2])
    b.append(2)
    b.join([2])  # cache row 2; its two tokens in cache rows 3 and 4
    b.check(b.append(1)[0], llm)
    assert (lane.virtual.calls, lane.virtual.rows, buckets[-1]) == (1, 2, 20)  # not 68: the 16 rows above the batch


def test_a_call_with_virtual_rows_that_fails_leaves_no_table_row_at_the_joiners_blocks():
    """A capture or allocation failure inside the call: the virtual rows' tables point at the trash block again, so
    the next generation's rows (which get the freed blocks) are not written over by a stale row."""
    llm, _ = make_pair("llama")
    lane = FastLane(llm.double(), Role.LLM, 96, capacity=64, config=VIRTUAL, max_rows=8, kv_blocks=64)
    b = Batch(lane, seed=1)
    b.join([5])
    b.append(1)
    b.join([4])  # four virtual rows in the next call, which fails
    real = lane._decode_step
    lane._decode_step = lambda *a: (_ for _ in ()).throw(RuntimeError("simulated failure inside the call"))
    with pytest.raises(RuntimeError, match="simulated failure"):
        b.append(1)
    lane._decode_step = real
    free = sorted(set(range(8)) - set(lane.rows.slot))
    assert bool((lane.cache.table[free] == TRASH).all())
    lane.reset()
    again = Batch(lane, seed=7)
    again.join([5, 5, 5])  # three live rows in the 4-row bucket: cache row 3 runs as a dead row
    again.check(again.append(1)[0], llm)


def test_joiners_that_leave_before_the_next_call_are_not_prefilled():
    llm, _ = make_pair("llama")
    lane = FastLane(llm.double(), Role.LLM, 96, capacity=64, config=VIRTUAL, max_rows=8, kv_blocks=64)
    b = Batch(lane, seed=5)
    b.join([4, 3])
    b.append(2)
    b.join([3, 5])  # kept for the next call; the second leaves first (preempted, cancelled)
    b.keep([0, 1, 2])
    b.check(b.append(1)[0], llm)
    assert (lane.virtual.calls, lane.virtual.rows, lane.join_groups) == (1, 3, 0)  # the one that stays: 3 tokens


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_kept_joins_follow_rows_leaving_and_the_columns_moving(arch):
    """Rows leave (the live ones move down a batch bucket, their table rows with them), the columns are trimmed and
    padded on the left between a join and the next call: the kept joins follow, ride that call, and every row's
    logits equal its plain forward; only a kept join that waits a step (``hold_rows``) takes the twin."""
    llm, _ = make_pair(arch)
    lane = FastLane(llm.double(), Role.LLM, 96, capacity=64, config=VIRTUAL, max_rows=32, kv_blocks=64)
    b = Batch(lane, seed=8)
    b.join([2, 6, 3, 7, 4])
    b.append(2)
    b.join([5, 3])  # rows 5 and 6, kept
    cut = b.keep([2, 4, 5, 6])  # rows 0, 1 and 3 leave: four fit the bucket of four, the rows above move down
    assert cut == 3 and lane.row_moves > 0
    b.check(b.append(3)[0], llm)
    assert (lane.virtual.calls, lane.join_groups) == (1, 0)
    b.join([12, 2])  # longer than the shared columns: the lane pads left first, then keeps both
    b.keep([0, 1, 2, 4, 5])  # the first row leaves
    b.check(b.append(1)[0], llm)
    assert (lane.virtual.calls, lane.join_groups) == (2, 0)
    b.join([3])
    b.hold([0])  # another row waits a step: the kept join still rides
    b.check(b.append(1)[0], llm)
    assert (lane.virtual.calls, lane.join_groups, lane.virtual.flushes) == (3, 0, {})
    b.join([4])
    b.hold([b.seq.shape[0] - 1])  # the kept join itself waits: the twin reads it first
    b.check(b.append(1)[0], llm)
    assert (lane.virtual.calls, lane.join_groups, lane.virtual.flushes) == (3, 1, {"hold": 1})


def test_a_call_wider_than_virtual_rows_ride_takes_the_twin_and_spare_buckets_warm_only_their_widths():
    llm, _ = make_pair("llama")
    config = dataclasses.replace(VIRTUAL, max_bucket=16)
    lane = FastLane(llm.double(), Role.LLM, 96, capacity=64, config=config, max_rows=4 + 16, kv_blocks=64,
                    spare_rows=16)
    b = Batch(lane, seed=9)
    b.join([3])
    b.append(2)
    b.join([4])
    b.check(b.append(WIDEST + 1)[0], llm)  # within max_bucket, past the widest call virtual rows ride
    assert (lane.virtual.calls, lane.virtual.flushes) == (0, {"wide call": 1})
    runs, run = [], lane.run
    lane.run = lambda ids, *a: (runs.append(tuple(ids.shape)), run(ids, *a))[1]
    lane.warm_up()
    spare = {size for rows, size in runs if rows > lane.rows.base}
    assert spare == {s for s in lane.buckets if s <= WIDEST} and {size for _, size in runs} == set(lane.buckets)


def test_a_request_engine_lane_built_for_a_smaller_batch_is_rebuilt_not_spilled_into_its_spare_rows():
    """A lane holds its batch plus ``virtual_joins`` spare rows: asked for a larger batch than its own, the engine
    builds a new lane (live rows never sit in the spare rows, whose buckets are warmed for virtual rows only)."""
    from hf_rstitch.fast import FastEngine

    llm, _ = make_pair("llama")
    engine = FastEngine(dataclasses.replace(VIRTUAL, virtual_joins=16), capacity=64)
    small = engine.lane(llm, Role.LLM, 96, 64, batch=8, kv_tokens=512)
    assert (small.rows.base, small.max_rows) == (8, 8 + 16)
    assert engine.lane(llm, Role.LLM, 96, 64, batch=8, kv_tokens=512) is small
    big = engine.lane(llm, Role.LLM, 96, 64, batch=20, kv_tokens=512)
    assert big is not small and big.rows.base == 20 and engine.builds == 2


def test_a_flush_that_fails_keeps_its_joins():
    """The join twin's prefill raising inside a verb (a pool out of blocks): the kept joins stay kept, not lost."""
    llm, _ = make_pair("llama")
    lane = FastLane(llm.double(), Role.LLM, 96, capacity=64, config=VIRTUAL, max_rows=8, kv_blocks=64)
    b = Batch(lane, seed=10)
    b.join([4])
    b.append(1)
    b.join([3])
    real = lane.joins.prefill
    lane.joins.prefill = lambda *a: (_ for _ in ()).throw(RuntimeError("simulated: out of blocks"))
    with pytest.raises(RuntimeError, match="out of blocks"):
        lane.crop(lane.seen)
    assert len(lane.virtual.pending) == 1 and lane.virtual.flushes == {}
    lane.joins.prefill = real
    b.check(b.append(1)[0], llm)
    assert lane.virtual.calls == 1


@pytest.mark.parametrize("budget", [64, 0])
def test_a_join_whole_while_the_twin_holds_a_stage_is_refused_at_once(budget):
    """Rows joining whole take the join twin (at once, or at a kept join's flush), whose rows hold a stage of chunked
    joins that its prefill would overwrite: refused when they join, by name, kept joins or not (the request engine
    joins rows whole only once a stage is joined or forgotten)."""
    llm, _ = make_pair("llama")
    config = dataclasses.replace(VIRTUAL, virtual_joins=budget)
    lane = FastLane(llm.double(), Role.LLM, 96, capacity=64, config=config, max_rows=8, kv_blocks=64)
    b = Batch(lane, seed=11)
    b.join([4])
    b.append(1)
    lane.stage_rows([[5, 6, 7, 8, 9, 10]])
    with pytest.raises(RuntimeError, match="holds a stage of chunked joins"):
        b.join([3])
    assert lane.virtual.pending == []
