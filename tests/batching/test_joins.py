"""Joins: the requests admitted in one step prefill together (batched groups of the fast lane's join twin), and
every request's greedy tokens, roles and per-call records equal those of one-by-one joins and of its solo run.
CPU FastLanes (eager steps), tiny random models."""

import pytest
from request_events import gather
from tiny_models import make_pair, prompt

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch.batching.requests import Request, RequestEngine
from hf_rstitch.core.roles import Role
from hf_rstitch.fast import FastConfig, joins

LENGTHS = [6, 4, 13, 3, 9, 5, 11, 7, 2]  # the 13-token prompt pads the batch on the left as it joins
MAX_NEW = [3, 14, 9, 12, 6, 10, 8, 5, 7]
TAUS = [0.3, 0.5, 0.6, 0.4, 0.55, 0.5, 0.45, 0.35, 0.6]


def solo(llm, slm, p, tau, max_new):
    return llm.generate(p, assistant_model=slm, stitch_threshold=tau, max_new_tokens=max_new,
                        return_dict_in_generate=True)


def calls(trace):
    return [(c.role, c.kind, c.n_inf, c.n_kv) for c in trace.calls]


def _requests():
    return [Request(prompt(n, seed=20 + i)[0].tolist(), max_new_tokens=m, stitch_threshold=t, request_id=f"r{i}")
            for i, (n, m, t) in enumerate(zip(LENGTHS, MAX_NEW, TAUS))]


def _run(llm, slm, join_rows, monkeypatch, config_rows=None, **engine_kw):
    """Two requests start the batch; after two steps seven more arrive at once and join together (a free row
    each): completions by id and the engine. ``join_rows``: the module's default; ``config_rows``: the config's."""
    monkeypatch.setattr(joins, "JOIN_ROWS", join_rows)
    config = FastConfig(graphs=False, max_bucket=4, join_rows=config_rows, virtual_joins=0)  # every join: the twin
    return _run_with(llm, slm, config, **engine_kw)


@pytest.mark.parametrize("arch", ["llama", "qwen2-full"])
def test_batched_joins_equal_one_by_one_joins_and_solo_runs(arch, monkeypatch):
    llm, slm = make_pair(arch)
    one, one_engine = _run(llm, slm, 1, monkeypatch)
    batched, engine = _run(llm, slm, 4, monkeypatch)
    for i, r in enumerate(_requests()):
        got, want = batched[r.request_id], one[r.request_id]
        assert got[0] == want[0] and got[1] == want[1], r.request_id
        assert got[2].roles == want[2].roles and calls(got[2]) == calls(want[2])
        p = prompt(LENGTHS[i], seed=20 + i)
        alone = solo(llm, slm, p, TAUS[i], MAX_NEW[i])
        assert got[0] == alone.sequences[0, p.shape[1]:].tolist(), r.request_id
        assert calls(got[2]) == calls(alone.stitch)
    for role in (Role.SLM, Role.LLM):  # seven joins of one step: a one-row group each that has columns to
        rows = one_engine.lanes[role].join_groups  # prefill (a 2-token prompt may have none yet), or groups of 4
        assert rows >= 5 and engine.lanes[role].join_groups == -(-rows // 4)


def test_a_configs_join_rows_groups_the_joins_as_the_default_does(monkeypatch):
    """``FastConfig(join_rows=4)`` over a module default of 1: the groups and outputs of a default of 4."""
    llm, slm = make_pair("llama")
    by_default, default_engine = _run(llm, slm, 4, monkeypatch)
    by_config, engine = _run(llm, slm, 1, monkeypatch, config_rows=4)
    assert by_config == by_default
    for role in (Role.SLM, Role.LLM):
        assert engine.lanes[role].join_groups == default_engine.lanes[role].join_groups


def _chunked(llm, slm, chunk, late_prompt=29, late_at=2):
    """One request decodes from the start; at step ``late_at`` a second with a ``late_prompt``-token prompt
    arrives. Per step, the requests that got a token; completions; the engine."""
    engine = RequestEngine.of(llm, slm, max_batch=4, max_length=96, prefill_chunk=chunk,
                              engine=FastConfig(graphs=False, max_bucket=4))
    a = Request(prompt(5, seed=3)[0].tolist(), max_new_tokens=24, stitch_threshold=0.45, request_id="a")
    b = Request(prompt(late_prompt, seed=4)[0].tolist(), max_new_tokens=6, stitch_threshold=0.5, request_id="b")
    engine.submit(a)
    got, tokens, done, k = [], {}, {}, 0
    while engine.has_work():
        if k == late_at:
            engine.submit(b)
        events = engine.step()
        engine.check_consistent()
        got.append({e.request_id for e in events if e.token is not None})
        gather(events, tokens, done)
        k += 1
    return got, done, engine


def test_a_long_prompt_joins_in_chunks_while_a_row_decodes_every_step():
    """prefill_chunk=4: the 29-token prompt is read 4 columns a step (28 columns: 7 steps) while the decoding
    request gets a token every step; both requests equal their solo runs, and a run without chunks."""
    llm, slm = make_pair("llama")
    got, done, engine = _chunked(llm, slm, 4)
    whole, done_whole, _ = _chunked(llm, slm, None)
    a_steps = [k for k, ids in enumerate(got) if "a" in ids]
    assert a_steps == list(range(24))  # a token every step, the join's chunks included
    first_b = min(k for k, ids in enumerate(got) if "b" in ids)
    assert first_b == 2 + 6  # submitted before step 2: chunks at steps 2..8 (7 of 4 columns), joins at step 8
    assert min(k for k, ids in enumerate(whole) if "b" in ids) == 2  # whole: joins at once
    assert engine._staging.steps == 7
    for rid, p, tau, m in (("a", prompt(5, seed=3), 0.45, 24), ("b", prompt(29, seed=4), 0.5, 6)):
        alone = solo(llm, slm, p, tau, m)
        assert done[rid][0] == done_whole[rid][0] == alone.sequences[0, p.shape[1]:].tolist(), rid
        assert calls(done[rid][2]) == calls(alone.stitch), rid


def test_chunked_joins_equal_whole_joins(monkeypatch):
    """Several requests join a decoding batch in groups read a chunk a step: the same tokens and records."""
    llm, slm = make_pair("qwen2-full")
    monkeypatch.setattr(joins, "JOIN_ROWS", 3)
    whole, _ = _run(llm, slm, 3, monkeypatch)
    engine_kw = {"prefill_chunk": 6}
    chunked, engine = _run(llm, slm, 3, monkeypatch, **engine_kw)
    assert engine._staging.steps > 3
    for rid, (tokens, reason, trace) in whole.items():
        assert chunked[rid][0] == tokens and chunked[rid][1] == reason, rid
        assert chunked[rid][2].roles == trace.roles and calls(chunked[rid][2]) == calls(trace), rid


def test_a_failing_chunk_fails_the_batch_and_returns_the_joining_request_to_the_queue():
    """A lane raises while reading a joining prompt's chunk: the running request ends with an error, the joining one
    goes back to the queue (still WAITING) and later completes as its solo run; a cancel mid-join ends it alone."""
    from hf_rstitch.batching.requests import StepFailed

    llm, slm = make_pair("llama")
    engine = RequestEngine.of(llm, slm, max_batch=4, max_length=96, prefill_chunk=4,
                              engine=FastConfig(graphs=False, max_bucket=4))
    engine.submit(Request(prompt(5, seed=3)[0].tolist(), max_new_tokens=30, stitch_threshold=0.45, request_id="a"))
    engine.step()
    p = prompt(29, seed=4)
    engine.submit(Request(p[0].tolist(), max_new_tokens=6, stitch_threshold=0.5, request_id="b"))
    engine.submit(Request(prompt(9, seed=5)[0].tolist(), max_new_tokens=6, request_id="c"))
    engine.step()  # b and c are one group, being read
    assert engine.waiting == 2 and engine.running == 1
    engine.cancel("c")
    assert [e.finish_reason for e in engine.step() if e.finished] == ["cancelled"]
    lane = engine.lanes[Role.LLM]
    real = lane.prefill_staged
    lane.prefill_staged = lambda budget: (_ for _ in ()).throw(RuntimeError("device lost"))
    with pytest.raises(StepFailed) as failed:
        engine.step()
    assert {(e.request_id, e.finish_reason) for e in failed.value.events} == {("a", "error")}
    engine.check_consistent()
    assert engine.waiting == 1 and engine.running == 0
    lane.prefill_staged = real
    done = engine.run()
    alone = solo(llm, slm, p, 0.5, 6)
    assert done["b"].tokens == alone.sequences[0, p.shape[1]:].tolist()


@pytest.mark.parametrize("option", [{"run_ahead": True}, {"schedule": "gather:3:4"}])
def test_chunked_joins_with_run_ahead_or_a_schedule_equal_solo_runs(option):
    """Chunked joins next to the engine's other step options (lanes run ahead; rows wait for the LLM): requests
    arriving while others decode equal their solo runs."""
    llm, slm = make_pair("llama")
    cfg = FastConfig(graphs=False, max_bucket=4, run_ahead=option.get("run_ahead", False))
    engine = RequestEngine.of(llm, slm, max_batch=4, max_length=96, prefill_chunk=5, engine=cfg,
                              schedule=option.get("schedule"))
    lengths, news, taus = [4, 17, 9, 23, 6], [20, 8, 12, 6, 9], [0.6, 0.65, 0.55, 0.6, 0.7]
    reqs = [Request(prompt(n, seed=60 + i)[0].tolist(), max_new_tokens=m, stitch_threshold=t, request_id=f"q{i}")
            for i, (n, m, t) in enumerate(zip(lengths, news, taus))]
    arrive = {0: [reqs[0]], 1: [reqs[1], reqs[2]], 4: [reqs[3]], 6: [reqs[4]]}
    tokens, k = {}, 0
    while engine.has_work() or k <= max(arrive):
        for r in arrive.get(k, []):
            engine.submit(r)
        for e in engine.step():
            if e.token is not None:
                tokens.setdefault(e.request_id, []).append(e.token)
        engine.check_consistent()
        k += 1
    assert engine._staging.steps > 0
    assert engine.stats["ahead" if "run_ahead" in option else "held"] > 0  # the option did act
    for i, r in enumerate(reqs):
        p = prompt(lengths[i], seed=60 + i)
        assert tokens[r.request_id] == solo(llm, slm, p, taus[i], news[i]).sequences[0, p.shape[1]:].tolist(), i


def test_a_joining_chunk_is_read_after_the_step_is_queued_and_before_its_values_are_read(monkeypatch):
    """The chunk of a joining group is queued right after a step's calls (the device reads it while the host reads
    that step): in every step after the group's first, each lane reads one chunk between the step's execute and its
    values' read, and no chunk at the next schedule -- one chunk a step, as before."""
    from hf_rstitch.batching import executor

    llm, slm = make_pair("llama")
    engine = RequestEngine.of(llm, slm, max_batch=4, max_length=96, prefill_chunk=4,
                              engine=FastConfig(graphs=False, max_bucket=4))
    log = []
    for role, lane in engine.lanes.items():
        real = lane.prefill_staged
        monkeypatch.setattr(lane, "prefill_staged", lambda budget, _r=real, _n=role.value: (log.append(_n), _r(budget))[1])
    real_wait, real_execute = executor.StepRun.wait, executor.Executor.execute
    monkeypatch.setattr(executor.StepRun, "wait", lambda self: (log.append("wait"), real_wait(self))[1])
    monkeypatch.setattr(executor.Executor, "execute", lambda self, *a: (log.append("execute"), real_execute(self, *a))[1])
    engine.submit(Request(prompt(5, seed=3)[0].tolist(), max_new_tokens=12, stitch_threshold=0.45, request_id="a"))
    engine.step()
    engine.submit(Request(prompt(29, seed=4)[0].tolist(), max_new_tokens=4, stitch_threshold=0.5, request_id="b"))
    per_step = []
    while engine.has_work():
        log.clear()
        engine.step()
        per_step.append(list(log))
    reads = [s for s in per_step if len(s) > 2]
    lanes = sorted(r.value for r in engine.lanes)
    # the step that takes the group: its first chunk at the schedule, the second read ahead once the step is queued
    first = reads[0]
    assert sorted(first[:2]) == lanes and first[2] == "execute" and sorted(first[3:5]) == lanes, per_step
    assert first[5:] == ["wait"], per_step
    for s in reads[1:]:  # each later chunk: after the step is queued, before its values are read
        assert s[0] == "execute" and sorted(s[1:3]) == lanes and s[3:] == ["wait"], per_step
    assert engine._staging.steps == 7  # 28 columns of 4, as without reading ahead


def test_a_paged_lanes_join_twin_grows_with_its_batch_and_a_static_ones_does_not():
    """Joins.room: an eighth of a paged lane's batch within [JOIN_ROWS, MAX_JOIN_ROWS] (one join call for a step's
    joiners under load), JOIN_ROWS for a static cache, the config's join_rows where given, never past the batch (its
    rows.base: a lane's spare rows for virtual joins are not counted)."""
    from types import SimpleNamespace

    def room(max_rows, paged=True, join_rows=None, spare=0):
        lane = SimpleNamespace(max_rows=max_rows + spare, rows=SimpleNamespace(base=max_rows),
                               config=FastConfig(join_rows=join_rows), kv_pool=object() if paged else None)
        return joins.Joins(lane).room

    assert [room(n) for n in (3, 8, 64, 128, 200, 256, 1024)] == [3, 8, 8, 16, 25, 32, 32]
    assert [room(n, paged=False) for n in (3, 64, 256)] == [3, 8, 8]
    assert room(256, join_rows=8) == 8 and room(4, join_rows=16) == 4
    assert room(64, spare=64) == 8  # the spare rows of virtual joins are not the batch


def _run_with(llm, slm, config: FastConfig, max_batch: int = 9, **engine_kw):
    """Two requests start the batch; after two steps seven more arrive at once and join together (a free row each),
    on an engine of fast config ``config``: completions by id and the engine."""
    engine = RequestEngine.of(llm, slm, max_batch=max_batch, max_length=64, engine=config, **engine_kw)
    rs = _requests()
    for r in rs[:2]:
        engine.submit(r)
    done, tokens, k = {}, {}, 0
    while engine.has_work():
        if k == 2:
            for r in rs[2:]:
                engine.submit(r)
        gather(engine.step(), tokens, done)
        engine.check_consistent()
        k += 1
    return done, engine


@pytest.mark.parametrize("arch", ["llama", "qwen2-full", "gemma3"])
def test_joins_read_as_virtual_rows_equal_the_join_twins_and_solo_runs(arch):
    """``FastConfig(virtual_joins=64)`` (the default): joining prompts ride in the lanes' next call where they fit
    (the request engine's lanes hold 64 cache rows beyond its batch for them); tokens, roles and records equal the
    join twin's (``virtual_joins=0``) and each request's solo run."""
    llm, slm = make_pair(arch)
    base = FastConfig(graphs=False, max_bucket=4, virtual_joins=0)
    twin, _ = _run_with(llm, slm, base)
    virtual, engine = _run_with(llm, slm, FastConfig(graphs=False, max_bucket=4, virtual_joins=64))
    for i, r in enumerate(_requests()):
        got, want = virtual[r.request_id], twin[r.request_id]
        assert got[0] == want[0] and got[1] == want[1], r.request_id
        assert got[2].roles == want[2].roles and calls(got[2]) == calls(want[2])
        p = prompt(LENGTHS[i], seed=20 + i)
        assert got[0] == solo(llm, slm, p, TAUS[i], MAX_NEW[i]).sequences[0, p.shape[1]:].tolist(), r.request_id
    assert sum(engine.lanes[role].virtual.calls for role in (Role.SLM, Role.LLM)) > 0
    assert all(engine.lanes[role].max_rows == 9 + 64 for role in (Role.SLM, Role.LLM))


ZOO = ["llama", "qwen2", "qwen3", "gemma2", "gemma3_text", "mistral", "qwen2_moe", "gpt_oss", "phi3", "gpt2",
       "gpt_neox", "cohere2", "olmoe", "starcoder2", "granite"]


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ZOO)
def test_virtual_joins_write_what_the_join_twin_writes_across_the_zoo(model_type):
    """The default ``virtual_joins=64`` against every join a call of the join twin (``0``), on architectures of the
    fast engine's proven zoo that differ where a joiner's prompt read in another row could go wrong -- sliding windows
    (gemma2, gemma3, mistral, cohere2, gpt_oss, starcoder2), experts (qwen2_moe, gpt_oss, olmoe), learned or partial
    positions (gpt2, gpt_neox), fused projections (phi3), query-key norms (qwen3), attention sinks (gpt_oss):
    requests arriving over time, one cancelled, on paged CPU FastLanes that run ahead, at a threshold where routes
    mix: the same tokens, finish reasons, routes, per-call records and entropies, with joins read as virtual rows."""
    import torch
    from request_events import assert_same_completions, drive, route_record
    from zoo_models import VOCAB, request_pair

    llm, slm, tau = request_pair(model_type)
    g = torch.Generator().manual_seed(13)
    reqs = [dict(input_ids=torch.randint(3, VOCAB, (2 + (5 * i) % 11,), generator=g).tolist(),
                 max_new_tokens=3 + (7 * i) % 11, eos_token_id=[], request_id=f"v{i}") for i in range(10)]
    arrive = {0: [0, 1], 1: [2, 3], 2: [4], 4: [5, 6, 7], 6: [8], 7: [9]}
    got = {}
    for budget in (0, 64):
        config = FastConfig(graphs=False, max_bucket=4, run_ahead=True, virtual_joins=budget)
        eng = RequestEngine.of(llm, slm, max_batch=4, max_length=64, engine=config, threshold=tau, kv_tokens=512)
        got[budget] = drive(eng, [Request(**r) for r in reqs], arrive, cancel=(5, "v6"), last=route_record), eng
    (ref, _), (new, eng) = got[0], got[64]
    assert_same_completions(new, ref)
    assert sum(eng.lanes[role].virtual.calls for role in (Role.SLM, Role.LLM)) > 0
    assert {r for _, _, (roles, _, _) in ref.values() for r in roles} == {Role.SLM, Role.LLM}, "routes do not mix"
