"""The request engine over paged KV caches (hf_rstitch.fast.paged_kv, hf_rstitch.batching.scheduler): budgets far past
what static slabs of the same memory would hold, admission by free blocks, preemption that requeues rows and
loses nothing, every block back in its pool when requests finish or are cancelled."""

import pytest

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch import Role
from hf_rstitch.batching.kv_budget import KVBudget
from hf_rstitch.batching.requests import Request, RequestEngine
from hf_rstitch.fast import FastConfig
from request_events import gather
from tiny_models import make_pair, prompt

CPU = FastConfig(graphs=False, max_bucket=4)


def _engine(llm, slm, kv_tokens, max_batch=3, max_length=256, **kw):
    return RequestEngine.of(llm, slm, max_batch=max_batch, max_length=max_length, engine=CPU, kv_tokens=kv_tokens, **kw)


def _pools_whole(engine):
    for lane in engine.lanes.values():
        pool = lane.kv_pool
        joiner = [lane._join_lane.cache.tables] if lane._join_lane is not None else []
        lane.cache.tables.check(*joiner)
        assert pool.allocator.n_free == pool.allocator.usable, (lane.role, pool.allocator.n_free)


def _drive(engine, requests, cancel_at=None):
    """Step to the end, checking the bookkeeping; tokens, finish reasons and errors by request id."""
    for r in requests:
        engine.submit(r)
    tokens, done, k = {}, {}, 0
    while engine.has_work():
        if cancel_at and k in cancel_at:
            engine.cancel(cancel_at[k])
        gather(engine.step(), tokens, done, last=lambda e: e.error)
        engine.check_consistent()
        k += 1
    return done


def _alone(model, p, max_new):
    out = model.generate(p, max_new_tokens=max_new, do_sample=False)
    return out[0, p.shape[1]:].tolist()


def test_budgets_past_the_slabs_memory_are_served_and_equal_solo_runs():
    """A pool of 320 tokens a lane, max_length 256 for 3 rows: static slabs of that memory would hold 106 tokens a
    row; these requests ask for up to 120 and get exactly their solo runs' tokens."""
    llm, slm = make_pair("llama")
    engine = _engine(llm, slm, kv_tokens=320)
    prompts = [prompt(n, seed=60 + i) for i, n in enumerate([5, 12, 3, 9, 7])]
    news = [110, 40, 117, 60, 90]
    requests = [Request(p[0].tolist(), max_new_tokens=m, role=Role.LLM if i % 2 else Role.SLM, request_id=f"r{i}")
                for i, (p, m) in enumerate(zip(prompts, news))]
    done = _drive(engine, requests)
    for i, (p, m) in enumerate(zip(prompts, news)):
        want = _alone(llm if i % 2 else slm, p, m)
        assert done[f"r{i}"][0] == want and done[f"r{i}"][1] in ("stop", "length"), i
    assert max(len(p[0]) + m for p, m in zip(prompts, news)) > 320 // 3
    _pools_whole(engine)


def test_a_full_pool_requeues_the_newest_rows_and_they_resume_where_they_stopped():
    """6 blocks of 16 tokens a lane for 3 rows that each grow to ~60 tokens: rows are preempted and requeued
    (never an error, never an exception out of the engine); each request still gets every token it asked for,
    and pinned requests (whose route a resume cannot change) exactly their solo runs'."""
    llm, slm = make_pair("qwen2-full")
    engine = _engine(llm, slm, kv_tokens=96)
    prompts = [prompt(n, seed=80 + i) for i, n in enumerate([6, 10, 4, 8])]
    news = [50, 45, 55, 40]
    roles = [Role.LLM, Role.SLM, Role.LLM, None]
    def requests():
        return [Request(p[0].tolist(), max_new_tokens=m, role=role, stitch_threshold=None if role else 0.5,
                        request_id=f"r{i}", eos_token_id=[])
                for i, (p, m, role) in enumerate(zip(prompts, news, roles))]

    done = _drive(engine, requests())
    assert engine.stats["preempted"] > 0
    roomy = _drive(_engine(llm, slm, kv_tokens=None), requests())  # every row's budget: nothing preempted
    for i, (p, m, role) in enumerate(zip(prompts, news, roles)):
        toks, reason, error = done[f"r{i}"]
        assert (reason, error, len(toks)) == ("length", None, m), i
        if role is not None:
            assert toks == roomy[f"r{i}"][0], i
    _pools_whole(engine)


def test_admission_waits_for_free_blocks_and_cancelled_rows_give_theirs_back():
    llm, slm = make_pair("llama")
    engine = _engine(llm, slm, kv_tokens=64, max_batch=4)  # 4 blocks: two 20-token prompts fill it
    for i in range(3):
        engine.submit(Request(prompt(20, seed=i)[0].tolist(), max_new_tokens=8, request_id=f"r{i}", eos_token_id=[]))
    engine.step()
    assert engine.running == 1 and engine.waiting == 2  # 2 blocks + 1 growing: a second would leave no headroom
    engine.cancel("r0")
    engine.step()
    assert engine.running == 1 and engine._rows[0].request_id == "r1"
    while engine.has_work():
        engine.step()
    _pools_whole(engine)


def test_a_request_the_pool_can_never_hold_is_refused_at_submit():
    llm, slm = make_pair("llama")
    engine = _engine(llm, slm, kv_tokens=64)
    with pytest.raises(ValueError, match=r"exceeds the engine's KV memory \(64 tokens a lane\)"):
        engine.submit(Request([5] * 30, max_new_tokens=40))
    engine.submit(Request([5] * 30, max_new_tokens=30))  # 60 tokens + the next column: 4 blocks


# ---- the budget's arithmetic ---------------------------------------------------------------------
def test_budget_admits_in_order_with_one_block_of_headroom_a_row():
    kv = KVBudget(blocks=10, block=16)
    assert kv.need(15) == 1 and kv.need(16) == 2 and kv.need(0) == 1
    assert kv.admit([], [100]) == 1  # alone: 7 blocks, no headroom
    assert kv.admit([], [100, 10]) == 2  # 7 + 1 + 2 rows of headroom = 10
    assert kv.admit([], [100, 30]) == 1  # 7 + 2 + 2 > 10
    assert kv.admit([20, 20], [10, 10, 10]) == 2  # 2 + 2 + 1 + 1 + 4 = 10
    assert kv.admit([200], [1]) == 0


def test_budget_preempts_the_newest_rows_until_the_rest_fit():
    kv = KVBudget(blocks=6, block=16)
    assert kv.preempt([20, 20, 20]) == ([], [])  # 2 + 2 + 2
    assert kv.preempt([32, 20, 20]) == ([2], [])  # 3 + 2 + 2 > 6: the newest leaves
    assert kv.preempt([60, 40, 5]) == ([1, 2], [])
    assert kv.preempt([100, 5]) == ([1], [0])  # the oldest alone does not fit: it fails
    assert kv.preempt([]) == ([], [])


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(blocks=st.integers(1, 40), running=st.lists(st.integers(0, 300), max_size=8),
       waiting=st.lists(st.integers(0, 300), max_size=8))
def test_budget_never_admits_or_keeps_more_than_the_pool(blocks, running, waiting):
    kv = KVBudget(blocks=blocks, block=16)
    requeue, fail = kv.preempt(running)
    kept = [n for i, n in enumerate(running) if i not in requeue and i not in fail]
    assert sum(kv.need(n) for n in kept) <= blocks
    assert requeue == sorted(requeue) and all(i > 0 for i in requeue)  # the newest go, the oldest stays
    assert fail in ([], [0]) and (not fail or kept == [])
    k = kv.admit(kept, waiting)
    after = kept + waiting[:k]
    assert sum(kv.need(n) for n in after) <= blocks
    if k < len(waiting) and kept:  # the next one would have left a row without its next block
        assert sum(kv.need(n) for n in after + [waiting[k]]) + len(after) + 1 > blocks


def test_an_engine_shared_with_generate_gives_it_lanes_of_its_own_cache():
    """A FastEngine first used by a request engine (a 48-token pool) and then by generate (70 tokens, static cache):
    its lanes are rebuilt for generate, not reused with a pool too small for it."""
    from hf_rstitch.fast import FastEngine

    llm, slm = make_pair("llama")
    fast = FastEngine(CPU, max_batch=3)
    RequestEngine.of(llm, slm, max_batch=3, max_length=64, engine=fast, kv_tokens=48)
    assert fast._lanes[Role.LLM].kv_pool.n_blocks == 4
    ids = prompt(30)
    kw = dict(assistant_model=slm, stitch_threshold=0.5, max_new_tokens=40, min_new_tokens=40)
    out = llm.generate(ids, stitch_engine=fast, **kw)
    assert not fast._lanes[Role.LLM].paged
    assert out.tolist() == llm.generate(ids, stitch_engine="default", **kw).tolist()


def test_static_slabs_stay_available_and_give_the_same_tokens():
    llm, slm = make_pair("llama")
    prompts = [prompt(n, seed=5 + n) for n in (4, 9, 6)]

    def run(**kw):
        engine = RequestEngine.of(llm, slm, max_batch=2, max_length=64, engine=CPU, **kw)
        done = engine.run([Request(p[0].tolist(), max_new_tokens=20, stitch_threshold=0.5, request_id=str(i))
                           for i, p in enumerate(prompts)])
        return engine, {k: c.tokens for k, c in done.items()}

    static, want = run(paged=False)
    paged, got = run(kv_tokens=96)  # two rows of ~30 tokens and their headroom: nothing preempted
    assert static.kv is None and not static.lanes[Role.LLM].paged and paged.lanes[Role.LLM].paged
    assert got == want and paged.stats["preempted"] == 0
