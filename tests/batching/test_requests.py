"""Continuous batching: every request's output equals its solo ``generate``, whoever shares the batch."""

import threading

import pytest
import torch

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch import Role
from hf_rstitch.batching.requests import QueueFull, Request, RequestEngine
from request_events import gather
from tiny_models import make_pair, prompt

LENGTHS = [5, 11, 3, 8, 14, 2, 7]  # the 14-token prompt joins a narrower batch: it pads the batch on the left
MAX_NEW = [12, 5, 20, 9, 15, 7, 4]  # rows leave at different steps; waiting requests take their rows
TAUS = {"llama": [0.3, 0.5, 0.6, 0.4, 0.55, 0.5, 0.7], "qwen2": [0.3, 0.5, 0.6, 0.4, 0.55, 0.5, 0.7],
        "gemma3": [0.38, 0.45, 0.42, 0.45, 0.4, 0.5, 0.45]}  # its tiny LLM is unsure everywhere


def solo(llm, slm, p, tau, max_new):
    return llm.generate(p, assistant_model=slm, stitch_threshold=tau, max_new_tokens=max_new,
                        return_dict_in_generate=True)


def calls(trace):
    return [(c.role, c.kind, c.n_inf, c.n_kv) for c in trace.calls]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_each_request_equals_its_solo_run(arch):
    llm, slm = make_pair(arch)
    engine = RequestEngine.of(llm, slm, max_batch=3)
    prompts = [prompt(n, seed=i) for i, n in enumerate(LENGTHS)]
    requests = [Request(p[0].tolist(), max_new_tokens=m, stitch_threshold=t)
                for p, t, m in zip(prompts, TAUS[arch], MAX_NEW)]
    done = engine.run(requests)
    assert not engine.has_work() and engine.running == 0
    switched, roles = 0, set()
    for r, p, t, m in zip(requests, prompts, TAUS[arch], MAX_NEW):
        alone = solo(llm, slm, p, t, m)
        got = done[r.request_id]
        assert got.tokens == alone.sequences[0, p.shape[1]:].tolist(), r.request_id
        assert got.trace.roles == alone.stitch.roles
        assert calls(got.trace) == calls(alone.stitch)  # accounted as if it ran alone
        assert got.finish_reason == ("stop" if got.tokens[-1] == 1 else "length")
        switched += got.trace.switches > 0
        roles |= set(got.trace.roles)
    assert switched >= 1 and roles == {Role.SLM, Role.LLM}  # the thresholds really stitch, rows route apart


def test_requests_submitted_while_others_decode():
    llm, slm = make_pair("llama")
    engine = RequestEngine.of(llm, slm, threshold=0.5, max_batch=2)
    first = engine.submit(Request(prompt(6, seed=1)[0].tolist(), max_new_tokens=10))
    events = [e for _ in range(4) for e in engine.step()]
    late = engine.submit(Request(prompt(12, seed=2)[0].tolist(), max_new_tokens=6))
    events += list(engine.events())
    for rid, p, n in ((first, prompt(6, seed=1), 10), (late, prompt(12, seed=2), 6)):
        want = solo(llm, slm, p, 0.5, n).sequences[0, p.shape[1]:].tolist()
        assert [e.token for e in events if e.request_id == rid and e.token is not None] == want
        assert sum(e.finished for e in events if e.request_id == rid) == 1


def test_a_built_engine_handed_down_equals_one_built_from_the_models():
    from hf_rstitch.engine import EngineConfig, Pair, build

    llm, slm = make_pair("llama")
    requests = [Request(prompt(n, seed=i)[0].tolist(), max_new_tokens=m, stitch_threshold=0.5, request_id=str(i))
                for i, (n, m) in enumerate(zip(LENGTHS[:4], MAX_NEW[:4]))]
    built = build(Pair.of(llm, slm), EngineConfig(max_batch=2, max_length=4096, kv_memory=None).for_requests())
    handed = RequestEngine(built, threshold=0.5).run(requests)
    own = RequestEngine.of(llm, slm, threshold=0.5, max_batch=2).run(requests)
    assert {k: (c.tokens, c.trace.roles) for k, c in handed.items()} == \
        {k: (c.tokens, c.trace.roles) for k, c in own.items()}
    with pytest.raises(TypeError, match=r"RequestEngine\.of\(llm, slm"):
        RequestEngine(llm, slm)


def test_cancel_frees_the_row_and_reports_it():
    llm, slm = make_pair("llama")
    engine = RequestEngine.of(llm, slm, threshold=0.5, max_batch=1)
    a = engine.submit(Request(prompt(5)[0].tolist(), max_new_tokens=50, eos_token_id=[]))
    b = engine.submit(Request(prompt(7, seed=3)[0].tolist(), max_new_tokens=4))
    engine.step()
    assert engine.running == 1 and engine.waiting == 1
    engine.cancel(a)
    events = list(engine.events())
    assert events[0].request_id == a and events[0].finished and events[0].finish_reason == "cancelled"
    want = solo(llm, slm, prompt(7, seed=3), 0.5, 4).sequences[0, 7:].tolist()
    assert [e.token for e in events if e.request_id == b] == want


def test_queue_limit_and_bad_requests_fail_alone():
    llm, slm = make_pair("llama")
    engine = RequestEngine.of(llm, slm, max_batch=1, max_waiting=1)  # one limit: 1 row + 1 waiting
    engine.submit(Request([5, 6, 7], max_new_tokens=2))
    engine.submit(Request([5, 6, 7, 8], max_new_tokens=2))
    with pytest.raises(QueueFull, match=r"2 requests in flight \(limit 2 = max_batch 1 running \+ max_waiting 1"):
        engine.submit(Request([5, 6], max_new_tokens=2))
    for bad, match in [(Request([]), "non-empty"), (Request([5, 999]), "outside the vocabulary"),
                       (Request([5], max_new_tokens=0), "max_new_tokens"), (Request([5], stitch_threshold=2.0), "in \\[0, 1\\]"),
                       (Request([5], do_sample=True, temperature=0), "temperature"),
                       (Request([5], do_sample=True, seed=2**64), r"seed must be an integer in \[-2\*\*63, 2\*\*64\)"),
                       (Request([5], do_sample=True, temperature=float("nan")), "finite temperature"),
                       (Request([5], max_new_tokens=True), "max_new_tokens")]:
        with pytest.raises((ValueError, TypeError), match=match):
            engine.submit(bad)
    assert len(engine.run()) == 2


def test_sampled_requests_depend_only_on_their_seed():
    llm, slm = make_pair("llama")
    p = prompt(6, seed=4)[0].tolist()
    alone = RequestEngine.of(llm, slm, threshold=0.5).run([Request(p, max_new_tokens=8, do_sample=True, seed=7, top_p=0.9)])
    crowd = RequestEngine.of(llm, slm, threshold=0.5, max_batch=4).run(
        [Request(prompt(9, seed=s)[0].tolist(), max_new_tokens=8, do_sample=True, seed=s) for s in range(3)]
        + [Request(p, max_new_tokens=8, do_sample=True, seed=7, top_p=0.9, request_id="me")])
    assert crowd["me"].tokens == next(iter(alone.values())).tokens


def test_submit_and_cancel_are_thread_safe():
    """Threads submit and cancel while the main thread steps: each request ends exactly once, the cancelled ones
    as cancelled unless they finished first, and the bookkeeping holds after every step."""
    llm, slm = make_pair("llama")
    engine = RequestEngine.of(llm, slm, threshold=0.5, max_batch=4)
    ids, cancelled, go = [], [], threading.Event()

    def client(i):
        go.wait()
        rid = engine.submit(Request([3 + i, 4, 5], max_new_tokens=6))
        ids.append(rid)
        if i % 2:
            engine.cancel(rid)
            cancelled.append(rid)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    go.set()
    ends = {}
    while any(t.is_alive() for t in threads) or engine.has_work():
        for e in engine.step():
            if e.finished:
                assert e.request_id not in ends
                ends[e.request_id] = e.finish_reason
        engine.check_consistent()
    for t in threads:
        t.join()
    assert sorted(ends) == sorted(ids) and len(cancelled) == 4
    assert all(ends[r] in ("cancelled", "stop", "length") for r in cancelled)
    assert all(ends[r] in ("stop", "length") for r in ids if r not in cancelled)
    assert all(engine.status(r) is None for r in ids) and engine.running == engine.waiting == 0


def test_pinned_requests_are_the_single_models_and_a_shared_policy_routes_all():
    llm, slm = make_pair("llama")
    engine = RequestEngine.of(llm, slm, threshold=0.5, max_batch=3)
    ps = [prompt(n, seed=30 + i) for i, n in enumerate([4, 9, 6])]
    reqs = [Request(ps[0][0].tolist(), max_new_tokens=8, role=Role.LLM),
            Request(ps[1][0].tolist(), max_new_tokens=8, role="slm"),
            Request(ps[2][0].tolist(), max_new_tokens=8)]
    done = engine.run(reqs)
    for r, p, model in zip(reqs[:2], ps[:2], (llm, slm)):
        want = model.generate(p, max_new_tokens=8)[0, p.shape[1]:].tolist()
        assert done[r.request_id].tokens == want
        assert set(done[r.request_id].trace.roles) == {Role.LLM if model is llm else Role.SLM}
    assert done[reqs[2].request_id].tokens == solo(llm, slm, ps[2], 0.5, 8).sequences[0, 6:].tolist()
    replay = hf_rstitch.ReplayPolicy(["slm", "llm", "llm", "slm"])
    shared = RequestEngine.of(llm, slm, max_batch=2, policy=replay)
    with pytest.raises(ValueError, match="one policy"):
        shared.submit(Request([5, 6], stitch_threshold=0.1))
    out = shared.run([Request(ps[2][0].tolist(), max_new_tokens=4)])
    assert [r.value for r in next(iter(out.values())).trace.roles] == ["slm", "llm", "llm", "slm"]


@pytest.mark.parametrize("arch", ["llama", "qwen2-full"])
def test_requests_through_the_fast_engine_equal_solo_runs(arch):
    """The fast engine's lanes (static caches; eager steps off CUDA) behind the same request engine."""
    from hf_rstitch.fast import FastConfig

    llm, slm = make_pair(arch)
    engine = RequestEngine.of(llm, slm, max_batch=3, engine=FastConfig(graphs=False), max_length=64)
    prompts = [prompt(n, seed=40 + i) for i, n in enumerate([5, 12, 3, 8, 14])]
    taus, max_new = [0.3, 0.5, 0.6, 0.4, 0.55], [10, 4, 16, 7, 9]
    requests = [Request(p[0].tolist(), max_new_tokens=m, stitch_threshold=t) for p, t, m in zip(prompts, taus, max_new)]
    done = engine.run(requests)
    for r, p, t, m in zip(requests, prompts, taus, max_new):
        alone = solo(llm, slm, p, t, m)
        assert done[r.request_id].tokens == alone.sequences[0, p.shape[1]:].tolist(), r.request_id
        assert done[r.request_id].trace.roles == alone.stitch.roles
        assert calls(done[r.request_id].trace) == calls(alone.stitch)
    with pytest.raises(ValueError, match="max_length 64"):
        engine.submit(Request([5] * 60, max_new_tokens=10))


def _through_fast(llm, slm, requests, ahead: bool, cancel_at: dict | None = None, late: list | None = None):
    """Requests through a request engine on CPU FastLanes told to run ahead or not; completions by id, and
    the engine. ``cancel_at`` {step: request id} cancels there; ``late`` [(step, request)] submits there."""
    from hf_rstitch.fast import FastConfig

    engine = RequestEngine.of(llm, slm, max_batch=3, max_length=64,
                              engine=FastConfig(graphs=False, max_bucket=4, run_ahead=ahead))
    for r in requests:
        engine.submit(r)
    tokens, done, k = {}, {}, 0
    while engine.has_work() or late:
        for step, r in [x for x in (late or []) if x[0] == k]:
            engine.submit(r)
            late.remove((step, r))
        if cancel_at and k in cancel_at:
            engine.cancel(cancel_at[k])
        gather(engine.step(), tokens, done)
        assert_pads_mirror_the_mask(engine)
        k += 1
    return done, engine


def assert_pads_mirror_the_mask(engine):
    """The rows' left padding the engine keeps on the host (its trims read no device value) is the mask's."""
    from hf_rstitch.decode.lane import left_padding

    assert [row.pad for row in engine._rows] == left_padding(engine._mask.cpu()).tolist()


@pytest.mark.parametrize("schedule", [None, "gather:2:8"])
def test_host_padding_follows_joins_holds_trims_and_leaves(schedule):
    """Requests of different prompt lengths join a running batch (one pads it on the left), rows wait for
    the LLM (a schedule) and leave: after every step the host's padding counts equal the mask's."""
    llm, slm = make_pair("llama")
    engine = RequestEngine.of(llm, slm, threshold=0.45, max_batch=3, schedule=schedule)
    for i, (n, m) in enumerate(zip([5, 9, 3, 14, 6, 2], [6, 12, 4, 9, 15, 5])):
        engine.submit(Request(prompt(n, seed=90 + i)[0].tolist(), max_new_tokens=m))
    steps = 0
    while engine.has_work():
        engine.step()
        assert_pads_mirror_the_mask(engine)
        steps += 1
    assert steps > 10 and (schedule is None or engine.stats["held"] > 0)


def test_run_ahead_leaves_every_request_as_it_was():
    """Run-ahead in the request engine (CPU FastLanes told to): rows join, finish at different steps, one
    is cancelled mid-way, one arrives late; every request's tokens, finish reason, roles, per-call
    records and entropies equal those without run-ahead, which equal the solo runs; steps did run ahead."""
    llm, slm = make_pair("llama")
    prompts = [prompt(n, seed=70 + i) for i, n in enumerate([5, 12, 3, 8, 9, 6])]
    taus, news = [0.3, 0.5, 0.6, 0.4, 0.55, 0.45], [14, 6, 18, 9, 11, 30]

    def requests():
        rs = [Request(p[0].tolist(), max_new_tokens=m, stitch_threshold=t, request_id=f"r{i}")
              for i, (p, t, m) in enumerate(zip(prompts, taus, news))]
        return rs[:5], [(7, rs[5])]

    first, late = requests()
    plain, _ = _through_fast(llm, slm, first, False, {9: "r2"}, late)
    first, late = requests()
    ahead, engine = _through_fast(llm, slm, first, True, {9: "r2"}, late)
    assert engine.stats["ahead"] > 5
    assert plain.keys() == ahead.keys() == {f"r{i}" for i in range(6)}
    assert plain["r2"][1] == "cancelled"
    for rid, (toks, reason, trace) in plain.items():
        got_toks, got_reason, got = ahead[rid]
        assert (got_toks, got_reason) == (toks, reason), rid
        assert got.roles == trace.roles and calls(got) == calls(trace), rid
        assert got.entropies == pytest.approx(trace.entropies, abs=1e-9)
    for i in (0, 1, 3, 4, 5):  # the solo runs
        alone = solo(llm, slm, prompts[i], taus[i], news[i])
        assert ahead[f"r{i}"][0] == alone.sequences[0, prompts[i].shape[1]:].tolist()
