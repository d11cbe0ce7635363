"""The paged KV cache (hf_rstitch.fast.paged_kv) in a FastLane: the same tokens and logits as the static cache and
the eager engine, blocks taken as rows write and all returned when they leave.

fp64 tiny models read the paged cache through the gathered copy (the eager attentions); the float32 case runs the
Triton kernels (split attention, paged stores) where Triton runs (CUDA, or TRITON_INTERPRET=1 on CPU).
"""

import pytest
import torch

from hf_rstitch import ReplayPolicy, Role
from hf_rstitch.fast import FastConfig, FastEngine, FastLane
from hf_rstitch.fast.kernels import gemv
from hf_rstitch.fast.blocks import BLOCK_TOKENS, OutOfBlocks, blocks_for
from tiny_models import left_pad, make_pair, prompt

from .test_fast_batch import ROUTES, _batch, _same
from .test_fast_lane import ROUTE
from .test_fast_rows_join import Batch

PAGED = FastConfig(max_bucket=4, graphs=False, paged=True)


def _generate(llm, slm, ids, mask, engine, policy, n_new):
    return llm.generate(ids, attention_mask=mask, assistant_model=slm, stitch_policy=policy, stitch_engine=engine,
                        max_new_tokens=n_new, min_new_tokens=n_new, return_dict_in_generate=True, output_logits=True)


def _owned_match_tokens(lane: FastLane, batch: Batch) -> None:
    """Each live row owns exactly the blocks of the tokens it holds; no block lost or shared."""
    tables = lane.cache.tables
    tables.check(*([lane._join_lane.cache.tables] if lane._join_lane is not None else []))
    for r, row in enumerate(lane.rows.slot):
        tokens = int(batch.mask[r].sum()) if lane.seen else 0
        assert len(tables.owned[row]) == blocks_for(tokens), (r, row, tokens, tables.owned[row])


@pytest.mark.parametrize("arch", ["llama", "qwen2-full"])
def test_paged_engine_equals_default_engine_one_row_and_a_left_padded_batch(arch):
    llm, slm = make_pair(arch)
    ids = prompt(12)
    one = torch.ones_like(ids)
    _same(_generate(llm, slm, ids, one, FastEngine(PAGED), ReplayPolicy(ROUTE), len(ROUTE)),
          _generate(llm, slm, ids, one, "default", ReplayPolicy(ROUTE), len(ROUTE)))
    ids, mask = _batch(3)
    engine = FastEngine(PAGED)
    ref = _generate(llm, slm, ids, mask, "default", ReplayPolicy(ROUTES[:3]), 14)
    for _ in range(2):  # the second generation reuses the lanes: their blocks came back at the reset
        _same(_generate(llm, slm, ids, mask, engine, ReplayPolicy(ROUTES[:3]), 14), ref)
    lane = engine._lanes[Role.LLM]
    assert lane.paged and lane.cache.tables.n_owned() > 0
    lane.cache.tables.check()


def test_paged_engine_with_entropy_routing_equals_default_engine():
    llm, slm = make_pair("llama")
    ids, mask = _batch()
    mixed = 0
    for tau in (0.3, 0.5, 0.6):
        kw = dict(attention_mask=mask, assistant_model=slm, stitch_threshold=tau, max_new_tokens=14,
                  return_dict_in_generate=True, output_logits=True)
        ref = llm.generate(ids, **kw)
        _same(llm.generate(ids, stitch_engine=FastEngine(PAGED), **kw), ref)
        mixed += len({tuple(t.roles) for t in ref.stitch}) > 1
    assert mixed >= 1


def _lanes(llm, kv_blocks, config=FastConfig(max_bucket=4, graphs=False)):
    static = FastLane(llm, Role.LLM, 96, capacity=64, config=config, max_rows=4)
    paged = FastLane(llm, Role.LLM, 96, capacity=64, config=config, max_rows=4, kv_blocks=kv_blocks)
    return static, paged


class Twin:
    """The same joins, appends, holds and leaves on a static lane and a paged one."""

    def __init__(self, static, paged):
        self.a, self.b = Batch(static, seed=1), Batch(paged, seed=1)

    def do(self, verb, *args):
        out = [getattr(x, verb)(*args) for x in (self.a, self.b)]
        if verb == "append":
            torch.testing.assert_close(out[1][0], out[0][0], rtol=1e-9, atol=1e-9)
        return out[1]

    def hold(self, index):
        """Rows ``index`` get no token this step (as the request engine's held rows: one column right)."""
        for x in (self.a, self.b):
            x.hold(index)


def test_paged_lane_equals_static_lane_through_joins_holds_and_leaves():
    llm, _ = make_pair("qwen2-full")
    static, paged = _lanes(llm, kv_blocks=64)
    t = Twin(static, paged)
    t.do("join", [5, 3])
    t.do("append", 1)
    t.do("append", 2)
    _owned_match_tokens(paged, t.b)
    t.do("join", [11])  # the batch grows on the left: nothing moves in the paged cache
    t.do("append", 1)
    t.b.check(t.do("append", 1)[0], llm)
    t.hold([0, 2])
    t.do("append", 1)
    t.hold([1])
    t.do("append", 5)  # a catch-up past max_bucket=4
    t.do("join", [2])
    t.do("append", 3)
    _owned_match_tokens(paged, t.b)
    free, leaving = paged.cache.pool.allocator.n_free, len(paged.cache.tables.owned[paged.rows.slot[2]])
    t.do("keep", [0, 1, 3])  # the long row leaves: its blocks come back at once
    assert leaving > 0 and paged.cache.pool.allocator.n_free == free + leaving
    _owned_match_tokens(paged, t.b)
    t.do("append", 17)  # crosses a block boundary in every row
    t.do("keep", [2, 0])  # rows move down a bucket: their blocks go with them
    t.b.check(t.do("append", 1)[0], llm)
    _owned_match_tokens(paged, t.b)
    paged.reset()
    assert paged.cache.tables.n_owned() == 0
    assert paged.cache.pool.allocator.n_free == paged.cache.pool.allocator.usable


def test_a_short_pool_raises_out_of_blocks_taking_none_and_the_lane_goes_on():
    llm, _ = make_pair("qwen2-full")
    lane = FastLane(llm, Role.LLM, 96, capacity=128, config=FastConfig(max_bucket=4, graphs=False), max_rows=4,
                    kv_blocks=1 + 4)  # 4 blocks of 16 tokens
    b = Batch(lane, seed=3)
    b.join([20, 20])  # two blocks each
    b.check(b.append(1)[0], llm)
    assert lane.cache.pool.allocator.n_free == 0
    seen = lane.seen
    with pytest.raises(OutOfBlocks, match="need 2 more KV blocks"):
        b.append(BLOCK_TOKENS)  # both rows cross into a third block
    assert lane.seen == seen and lane.cache.pool.allocator.n_free == 0  # nothing taken, nothing run
    b.seq, b.mask = b.seq[:, :-BLOCK_TOKENS], b.mask[:, :-BLOCK_TOKENS]
    b.keep([1])
    assert lane.cache.pool.allocator.n_free == 2
    b.check(b.append(BLOCK_TOKENS)[0], llm)


def _float_pair(device):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    def qwen2(hidden, heads, layers, seed):  # head size 16: the kernels' smallest
        torch.manual_seed(seed)
        config = Qwen2Config(vocab_size=96, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                             num_attention_heads=heads, num_key_value_heads=heads // 2, max_position_embeddings=256)
        return Qwen2ForCausalLM(config).float().to(device).eval()

    return qwen2(64, 4, 2, 0), qwen2(32, 2, 1, 1)


@pytest.mark.skipif(not gemv.available("cpu") and not torch.cuda.is_available(),
                    reason="needs triton (CUDA, or TRITON_INTERPRET=1 on CPU)")
def test_paged_kernels_in_generate_equal_the_static_cache_and_the_eager_engine():
    """float32, B = 3 left-padded, a route that mixes both models: the split attention reading blocks and the paged
    stores (rotation fused) give the static cache's tokens and logits, and the eager engine's tokens."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    llm, slm = _float_pair(device)
    ids, mask = left_pad([prompt(n, seed=40 + n) for n in (9, 4, 17)])
    ids, mask = ids.to(device), mask.to(device)
    route = ["slm"] * 3 + ["llm"] * 2 + ["slm"] * 6 + ["llm"] * 5 + ["slm"] * 4
    outs = []
    for config in (FastConfig(max_bucket=4, graphs=device == "cuda"),
                   FastConfig(max_bucket=4, graphs=device == "cuda", paged=True)):
        engine = FastEngine(config, max_batch=3)
        outs.append(_generate(llm, slm, ids, mask, engine, ReplayPolicy(route), len(route)))
        lane = engine._lanes[Role.LLM]
        assert lane.paged == config.paged and (not lane.paged or not lane.cache.gather)  # the kernel reads blocks
    eager = _generate(llm, slm, ids, mask, "default", ReplayPolicy(route), len(route))
    assert torch.equal(outs[0].sequences, outs[1].sequences) and torch.equal(outs[1].sequences, eager.sequences)
    for a, b in zip(outs[0].logits, outs[1].logits):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_handing_several_rows_over_at_once_equals_one_at_a_time():
    """A join's rows go from the join twin to their lane in one hand-over (PagedKV.copy_rows): the device table and
    the host's block ownership equal handing them over row by row, and the twin's rows own nothing after."""
    from hf_rstitch.fast.blocks import TRASH
    from hf_rstitch.fast.paged_kv import BlockPool, PagedKV

    def caches():
        pool = BlockPool((2, 1, 4), 64, torch.float32, torch.device("cpu"))
        lane = PagedKV(pool, 6, 40, torch.zeros(6, dtype=torch.long))
        twin = PagedKV(pool, 4, 40, torch.zeros(4, dtype=torch.long))
        lane.reserve({0: 3, 5: 17})
        twin.reserve({0: 9, 1: 1, 2: 33, 3: 16})
        return lane, twin

    src, dst = [0, 2, 3, 1], [4, 1, 3, 2]
    at_once, twin_once = caches()
    at_once.copy_rows(twin_once, src, dst, 40)
    one_by_one, twin_each = caches()
    for s, d in zip(src, dst):
        one_by_one.copy_row(twin_each, s, d, 40)
    assert torch.equal(at_once.table, one_by_one.table)
    assert at_once.tables.covered == one_by_one.tables.covered
    assert torch.equal(twin_once.table, torch.full_like(twin_once.table, TRASH))
    assert (twin_once.table == twin_each.table).all()
    assert at_once.pool.allocator.n_free == one_by_one.pool.allocator.n_free
    at_once.tables.check(twin_once.tables)
    lane, twin = caches()
    for src, dst, other in (([0, 0], [1, 2], twin), ([0, 1], [2, 2], twin), ([0, 1], [2], twin), ([1, 2], [3, 4], lane)):
        with pytest.raises(ValueError, match="distinct rows"):
            lane.copy_rows(other, src, dst, 40)
    lane.tables.check(twin.tables)  # refused before any row moved
