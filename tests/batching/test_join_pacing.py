"""Join pacing (``join_wait`` / ``join_group``: hf_rstitch.core.scheduling.JoinPacing) changes when requests join, never
what they write: many requests arriving alone and in bursts, joining and leaving, greedy and seeded sampling, one
pinned to the LLM -- the same tokens, finish reasons, routes and per-call records as joins at once, with fewer join
steps. The eager engine and the fast engine's CPU static path (paged, running ahead, joining prompts read in chunks),
tiny random models."""

import pytest

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch.batching.requests import Request, RequestEngine
from hf_rstitch.core.roles import Role
from hf_rstitch.fast import FastConfig
from request_events import gather
from tiny_models import make_pair, prompt

N = 14
ARRIVE = {0: [0], 1: [1, 2, 3, 4, 5, 6], 4: [7], 5: [8], 9: [9, 10], 12: [11], 20: [12, 13]}  # step: requests


def _requests() -> list[Request]:
    return [Request(prompt(3 + (7 * i) % 11, seed=80 + i)[0].tolist(), max_new_tokens=5 + (5 * i) % 13,
                    stitch_threshold=0.35 + 0.05 * (i % 5), do_sample=i % 4 == 1, seed=i if i % 4 == 1 else None,
                    role=Role.LLM if i == 6 else None, request_id=f"q{i}") for i in range(N)]


def _run(llm, slm, engine, **kw):
    """Requests arrive at the steps of ARRIVE; completions by id, the step each request's first token came, and the
    engine (``kw``: pacing, a prefill chunk)."""
    eng = RequestEngine.of(llm, slm, max_batch=6, max_length=64, engine=engine, **kw)
    reqs, done, tokens, first, k = _requests(), {}, {}, {}, 0
    while eng.has_work() or k <= max(ARRIVE):
        for i in ARRIVE.get(k, []):
            eng.submit(reqs[i])
        events = eng.step()
        eng.check_consistent()
        for e in events:
            first.setdefault(e.request_id, k) if e.token is not None else None
        gather(events, tokens, done, last=lambda e: (e.trace.roles, [(c.role, c.kind, c.n_inf, c.n_kv)
                                                                     for c in e.trace.calls]))
        k += 1
    return done, first, eng


ENGINES = {"eager": ("default", {}), "fast-static": (FastConfig(graphs=False, max_bucket=4, paged=False), {}),
           "fast-paged-ahead": (FastConfig(graphs=False, max_bucket=4, run_ahead=True), {}),
           "fast-chunked": (FastConfig(graphs=False, max_bucket=4), {"prefill_chunk": 6})}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n != "eager" else n for n in ENGINES])
def test_paced_joins_write_what_joins_at_once_write(name):
    llm, slm = make_pair("llama")
    engine, kw = ENGINES[name]
    ref, first_ref, at_once = _run(llm, slm, engine, **kw)
    got, first, paced = _run(llm, slm, engine, join_wait=3, join_group=3, **kw)
    assert got == ref
    assert len(ref) == N and all(reason in ("stop", "length") for _, reason, _ in ref.values())
    assert len({tuple(roles) for _, _, (roles, _) in ref.values()}) > 2  # routes differ: switches happen
    assert paced.stats["paced"] > 0 and paced.stats["joins"] < at_once.stats["joins"]
    assert paced.stats["joined"] == at_once.stats["joined"] == N
    assert first["q0"] == first_ref["q0"] == 0  # a lone request into an empty batch: at once
    assert any(first[r] > first_ref[r] for r in ref)  # some joined later
    assert paced.stats["ahead"] > 0 or name != "fast-paged-ahead"  # pacing beside calls run ahead
