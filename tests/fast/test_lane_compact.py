"""Lanes that run only the rows a call needs (hf_rstitch.fast.lane_compact) equal the full-width lane: the same logits
for the rows they run, whichever rows take part, and the same tokens, routes and records through ``generate`` and
the request engine, paged and static, greedy and seeded sampling.

fp64 tiny models: logits to 1e-9.
"""

import dataclasses
import random

import pytest
import torch

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch import Role
from hf_rstitch.fast import FastConfig, FastEngine, FastLane
from hf_rstitch.fast.lane_compact import groups, place
from hf_rstitch.batching.requests import Request, RequestEngine
from tiny_models import left_pad, make_pair, prompt

from .test_fast_batch import _calls


def _config(compact: bool, paged: bool = True) -> FastConfig:
    return FastConfig(max_bucket=4, graphs=False, paged=paged, compact_rows=compact)


def test_place_brings_the_group_in_and_sends_rows_that_would_read_again_out():
    # live rows 0..5 in cache rows 5, 1, 0, 6, 2, 3; read columns 9, 9, 10, 9, 7, 10; the group: rows 0 and 3 (read 9)
    slot, read = [5, 1, 0, 6, 2, 3], [9, 9, 10, 9, 7, 10]
    swaps = place([0, 3], 4, 9, slot, read, max_rows=8)
    moved = {**{a: b for a, b in swaps}, **{b: a for a, b in swaps}}
    now = [moved.get(c, c) for c in slot]
    assert {now[0], now[3]} <= set(range(4))
    # in the bucket besides the group: no row that read past column 9 while a better row (or a free one) was left
    inside = [r for r, c in enumerate(now) if c < 4 and r not in (0, 3)]
    assert all(read[r] <= 9 for r in inside), (swaps, now)
    assert swaps == [(5, 0), (6, 3)]  # rows 0 and 3 in, rows 2 and 5 (read 10) out: two swaps, no more
    # row 1 sits in cache row 1 already; row 2 (cache row 0) read past column 9: row 0 (read 9) takes its place
    assert place([1], 2, 9, slot, read, max_rows=8) == [(0, 5)]
    assert place([2], 1, 10, slot, read, max_rows=8) == []  # alone in bucket 1, it stays where it is


def test_groups_are_the_rows_that_read_most_then_one_catch_up():
    read = [9, 9, 4, 7, 9, 8]
    assert groups([0, 1, 2, 3, 4, 5], read) == [(9, [0, 1, 4]), (4, [2, 3, 5])]
    assert groups([3], read) == [(7, [3])]
    assert groups([], read) == []


def _lanes(llm, rows: int, paged: bool):
    return [FastLane(llm, Role.LLM, 96, capacity=48, config=_config(compact, paged), max_rows=rows)
            for compact in (False, True)]


@pytest.mark.parametrize("paged", [True, False])
def test_any_subset_of_rows_gets_the_full_width_lanes_logits(paged):
    """Step by step over a growing sequence, the compact lane runs empty, one-row, every-row and random subsets
    (rows falling behind and catching up over several columns, past max_bucket); its logits for those rows equal
    the full-width lane's, which runs every row every step. Rows that leave free their cache rows; no other row
    moves."""
    llm, _ = make_pair("llama")
    rows = 7
    full, compact = _lanes(llm, rows, paged)
    seq, mask = left_pad([prompt(3 + (5 * i) % 9, seed=40 + i) for i in range(rows)])
    gen = random.Random(3)
    fixed = {0: [], 1: [2], 2: list(range(rows)), 6: [], 7: [5]}  # two steps out: catch-ups past max_bucket=4
    needed = 0
    for step in range(17):
        n = seq.shape[0]
        subset = fixed.get(step, gen.sample(range(n), gen.randint(1, n)))
        run = torch.zeros(n, dtype=torch.bool)
        run[subset] = True
        every = torch.ones(n, dtype=torch.bool)
        ref, _, _ = full.advance(seq, mask, every, every)
        got, _, calls = compact.advance(seq, mask, run, ~run, run=run)
        needed += len(subset)
        assert compact.ran[run].all() and set(calls) == set(subset), step
        torch.testing.assert_close(got[compact.ran], ref[compact.ran], rtol=1e-9, atol=1e-9)
        seq = torch.cat([seq, ref.argmax(-1)[:, None]], dim=-1)
        mask = torch.cat([mask, torch.ones(n, 1, dtype=mask.dtype)], dim=-1)
        if step == 10:  # rows 1, 4 and 5 leave
            keep = torch.tensor([0, 2, 3, 6])
            before = [compact.rows.slot[i] for i in keep.tolist()]
            full.keep_rows(keep)
            compact.keep_rows(keep)
            assert compact.rows.slot == before and compact.row_moves == 0
            seq, mask = seq[keep], mask[keep]
    counts = compact.row_counts
    assert counts["rows_needed"] == needed and counts["rows_run"] < full.row_counts["rows_run"]
    if paged:
        compact.cache.tables.check()


def _generate(llm, slm, ids, mask, config, sample: bool):
    torch.manual_seed(11)
    engine = FastEngine(config)
    out = llm.generate(ids, attention_mask=mask, assistant_model=slm, stitch_threshold=0.45, stitch_engine=engine,
                       max_new_tokens=10, do_sample=sample, return_dict_in_generate=True, output_logits=True)
    return out, engine


def _traces(out):
    return out.stitch if isinstance(out.stitch, list) else [out.stitch]  # B = 1: one trace


def _same_generate(rows: int, paged: bool, sample: bool):
    llm, slm = make_pair("llama")
    ids, mask = left_pad([prompt(2 + (7 * i) % 11, seed=i) for i in range(rows)])
    ref, full = _generate(llm, slm, ids, mask, _config(False, paged), sample)
    out, engine = _generate(llm, slm, ids, mask, _config(True, paged), sample)
    assert torch.equal(out.sequences, ref.sequences)
    out.stitch, ref.stitch = _traces(out), _traces(ref)
    assert [t.roles for t in out.stitch] == [t.roles for t in ref.stitch]
    assert [_calls(t) for t in out.stitch] == [_calls(t) for t in ref.stitch]
    for a, b in zip(out.logits, ref.logits):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    roles = {r for t in ref.stitch for r in t.roles}
    counts = [[lane.row_counts for lane in e._lanes.values()] for e in (engine, full)]
    assert [c["rows_needed"] for c in counts[0]] == [c["rows_needed"] for c in counts[1]]
    assert all(c["rows_needed"] <= c["rows_run"] for c in counts[0])
    return counts, roles


@pytest.mark.parametrize("rows,paged,sample", [(1, True, False), (6, True, False), (6, False, False)])
def test_generate_with_compact_lanes_equals_the_full_width_lanes(rows, paged, sample):
    _, roles = _same_generate(rows, paged, sample)
    assert rows == 1 or roles == {Role.SLM, Role.LLM}


@pytest.mark.slow
@pytest.mark.parametrize("rows,sample", [(6, True), (33, True), (100, False), (256, True)])
def test_generate_with_compact_lanes_equals_the_full_width_lanes_at_many_rows(rows, sample):
    (compact, full), _ = _same_generate(rows, True, sample)
    assert sum(c["rows_run"] for c in compact) < sum(c["rows_run"] for c in full)  # fewer rows ran


def _serve(llm, slm, compact: bool, requests):
    engine = RequestEngine.of(llm, slm, max_batch=5, max_length=96, engine=_config(compact), threshold=0.45)
    done = engine.run([Request(**r) for r in requests])
    return {k: (c.tokens, c.finish_reason, c.trace.roles, [_ for _ in map(_call, c.trace.calls)])
            for k, c in done.items()}, engine


def _call(c):
    return c.role, c.kind, c.n_inf, c.n_kv


def test_request_engine_with_compact_lanes_equals_the_full_width_lanes():
    """Requests joining and leaving, greedy and seeded sampling, one pinned to the LLM: the same tokens, routes and
    records."""
    llm, slm = make_pair("llama")
    requests = [dict(input_ids=prompt(3 + (5 * i) % 9, seed=70 + i)[0].tolist(), max_new_tokens=4 + (3 * i) % 9,
                     request_id=f"r{i}", do_sample=i % 3 == 1, seed=i if i % 3 == 1 else None,
                     role=Role.LLM if i == 4 else None)
                for i in range(9)]
    ref, _ = _serve(llm, slm, False, requests)
    got, engine = _serve(llm, slm, True, requests)
    assert got == ref
    assert len({tuple(v[2]) for v in ref.values()}) > 1
    counts = engine.lanes[Role.LLM].row_counts
    assert counts["rows_run"] < engine.lanes[Role.LLM].row_counts["calls"] * 5


def test_an_early_call_over_known_rows_then_the_rest_equals_one_full_width_call():
    """The LLM's call queued before the hand-over decisions are read (CUDA only in a step: decisions on the device)
    runs the rows already the LLM's; the rows handed over run once the decisions are read (decode.step._advance):
    together, the full-width lane's logits for every row they needed, and one record each."""
    from hf_rstitch.decode.step import _advance, call_early

    llm, _ = make_pair("llama")
    rows = 6
    early = dataclasses.replace(_config(True), run_ahead=True)
    full = FastLane(llm, Role.LLM, 96, capacity=48, config=_config(False), max_rows=rows)
    compact = FastLane(llm, Role.LLM, 96, capacity=48, config=early, max_rows=rows)
    seq, mask = left_pad([prompt(3 + (5 * i) % 9, seed=50 + i) for i in range(rows)])
    every = torch.ones(rows, dtype=torch.bool)
    for step, (known, handed) in enumerate([([0, 1], [3]), ([0], []), ([2, 3], [0, 4, 5]), ([1], [2])]):
        llm_on, run = torch.zeros(rows, dtype=torch.bool), torch.zeros(rows, dtype=torch.bool)
        llm_on[known] = True
        run[known + handed] = True
        ref, _, _ = full.advance(seq, mask, every, every)
        ahead = call_early(compact, seq, mask, run=llm_on)
        got, _, calls = _advance(compact, ahead, seq, mask, run, ~run, False, run=run)
        assert set(calls) == set(known + handed), step
        torch.testing.assert_close(got[run], ref[run], rtol=1e-9, atol=1e-9)
        seq = torch.cat([seq, ref.argmax(-1)[:, None]], dim=-1)
        mask = torch.cat([mask, torch.ones(rows, 1, dtype=mask.dtype)], dim=-1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("compile", [None, "parts"])
def test_fp32_compact_lanes_on_cuda_with_graphs_equal_the_default_engine(compile):
    """The CUDA path: captured graphs of every bucket, paged caches, B = 5 with independent replayed routes and rows
    1 and 3 ending early (an end token): the same tokens and routes as the eager engine, logits within 1e-3, fewer
    rows run than the full-width lane's."""
    from .test_fast_gpu import BATCH_ROUTES, assert_batched_equal, batched_reference

    llm, slm, ids, mask, eos, ref = batched_reference()
    runs = {}
    for compact in (False, True):
        engine = FastEngine(FastConfig(max_bucket=8, compile=compile, paged=True, compact_rows=compact))
        assert_batched_equal(engine, llm, slm, ids, mask, eos, ref)
        runs[compact] = sum(lane.row_counts["rows_run"] for lane in engine._lanes.values())
    assert len(BATCH_ROUTES) == 5 and runs[True] < runs[False], runs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fp32_request_engine_with_compact_lanes_on_cuda_equals_the_full_width_lanes():
    """Requests joining and leaving on CUDA graphs (paged, buckets up to 16, 4 rows): compact lanes give the same
    tokens and routes as the full-width lanes."""
    from hf_rstitch.fast.routes import route

    from .test_fast_gpu import _RoutePerRequest, _pair

    llm, slm = _pair(torch.float32)
    got = {}
    for compact in (False, True):
        fast = FastEngine(FastConfig(max_bucket=16, paged=True, compact_rows=compact), capacity=128, max_batch=4)
        policy = _RoutePerRequest({str(i): route(60, 20, 3, seed=10 + i) for i in range(10)})
        engine = RequestEngine.of(llm, slm, max_batch=4, policy=policy, engine=fast, max_length=128)
        policy.engine = engine
        g = torch.Generator().manual_seed(0)
        reqs = [Request(torch.randint(3, 1024, (5 + 3 * i,), generator=g).tolist(), max_new_tokens=30 + 3 * i,
                        eos_token_id=[], request_id=str(i)) for i in range(10)]
        got[compact] = {k: (c.tokens, c.trace.roles) for k, c in engine.run(reqs).items()}
    assert got[True] == got[False]
