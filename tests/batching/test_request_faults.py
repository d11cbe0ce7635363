"""A request's faults stay with it: bad parameters fail at ``submit`` before touching the rows, a row whose
sampling fails leaves alone, a step that fails for the batch ends only the running requests and leaves the
engine consistent; the innocent requests' tokens equal their solo runs throughout."""

import pytest

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch.batching import requests as engine_requests
from hf_rstitch.batching.requests import Request, RequestEngine, RequestStatus, StepFailed
from tiny_models import make_pair, prompt

TAU = 0.5


def solo_tokens(llm, slm, n, seed, max_new):
    p = prompt(n, seed=seed)
    out = llm.generate(p, assistant_model=slm, stitch_threshold=TAU, max_new_tokens=max_new)
    return out[0, n:].tolist()


def drive(engine, events=()):
    """Step until done, checking the bookkeeping after every step; tokens and finishing events by id."""
    tokens, ends = {}, {}
    while events or engine.has_work():
        for e in events or engine.step():
            if e.token is not None:
                tokens.setdefault(e.request_id, []).append(e.token)
            if e.finished:
                ends[e.request_id] = e
        engine.check_consistent()
        events = ()
    return tokens, ends


def test_the_wedge_scenario_is_a_clean_refusal():
    """max_batch 2, two long requests running, one queued, then a seed no torch.Generator takes: the bad
    request is refused at submit, the three others decode as if alone, and the engine takes new work."""
    llm, slm = make_pair("llama")
    engine = RequestEngine.of(llm, slm, threshold=TAU, max_batch=2)
    good = [engine.submit(Request(prompt(n, seed=s)[0].tolist(), max_new_tokens=m))
            for n, s, m in ((6, 1, 14), (9, 2, 12), (4, 3, 6))]
    first = engine.step()
    assert [engine.status(r) for r in good] == [RequestStatus.RUNNING] * 2 + [RequestStatus.WAITING]
    bad = Request([5, 6, 7], do_sample=True, temperature=0.7, seed=2**64)
    with pytest.raises(ValueError, match="seed"):
        engine.submit(bad)
    assert bad == Request([5, 6, 7], do_sample=True, temperature=0.7, seed=2**64)  # not edited by the engine
    engine.check_consistent()
    late = engine.submit(Request(prompt(5, seed=4)[0].tolist(), max_new_tokens=5))
    tokens, ends = drive(engine, first)
    for rid, (n, s, m) in zip(good + [late], ((6, 1, 14), (9, 2, 12), (4, 3, 6), (5, 4, 5))):
        assert tokens[rid] == solo_tokens(llm, slm, n, s, m) and ends[rid].finish_reason in ("stop", "length")


@pytest.mark.parametrize("temperature, top_p", [(1e-45, 1.0), (0.7, 5e-324), (5e-324, 1e-300)])
def test_extreme_sampling_values_decode_numerically(temperature, top_p):
    """Tiny temperatures tend to argmax and a tiny top_p keeps the top token: the request decodes greedily."""
    llm, slm = make_pair("llama")
    engine = RequestEngine.of(llm, slm, threshold=TAU, max_batch=2)
    ids = prompt(6, seed=5)[0].tolist()
    odd = engine.submit(Request(ids, max_new_tokens=6, do_sample=True, temperature=temperature, top_p=top_p, seed=3,
                                eos_token_id=[]))
    other = engine.submit(Request(prompt(7, seed=6)[0].tolist(), max_new_tokens=6))
    tokens, ends = drive(engine)
    assert ends[odd].finish_reason in ("stop", "length") and tokens[odd]
    assert tokens[other] == solo_tokens(llm, slm, 7, 6, 6)


def test_a_row_whose_sampling_fails_leaves_alone(monkeypatch):
    llm, slm = make_pair("llama")
    real = engine_requests.sample_one

    def flaky(logits, temperature, top_p, generator=None):
        if temperature == 0.123:
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        return real(logits, temperature, top_p, generator)

    monkeypatch.setattr(engine_requests, "sample_one", flaky)
    engine = RequestEngine.of(llm, slm, threshold=TAU, max_batch=3)
    a = engine.submit(Request(prompt(6, seed=1)[0].tolist(), max_new_tokens=8))
    bad = engine.submit(Request([5, 6, 7, 8], max_new_tokens=8, do_sample=True, temperature=0.123, seed=1))
    b = engine.submit(Request(prompt(9, seed=2)[0].tolist(), max_new_tokens=8))
    tokens, ends = drive(engine)
    assert ends[bad].finish_reason == "error" and "sampling failed for this request" in ends[bad].error
    assert bad not in tokens
    assert tokens[a] == solo_tokens(llm, slm, 6, 1, 8) and tokens[b] == solo_tokens(llm, slm, 9, 2, 8)


def test_a_failed_step_ends_the_running_requests_and_the_engine_goes_on(monkeypatch):
    llm, slm = make_pair("llama")
    real, calls = engine_requests.run_step, []

    def failing_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_requests, "run_step", failing_once)
    engine = RequestEngine.of(llm, slm, threshold=TAU, max_batch=2)
    running = [engine.submit(Request(prompt(n, seed=s)[0].tolist(), max_new_tokens=8))
               for n, s in ((6, 1), (8, 2))]
    queued = engine.submit(Request(prompt(5, seed=3)[0].tolist(), max_new_tokens=6))
    engine.step(), engine.step()
    with pytest.raises(StepFailed, match="CUDA error") as failure:
        engine.step()
    assert {e.request_id: e.finish_reason for e in failure.value.events} == dict.fromkeys(running, "error")
    engine.check_consistent()
    assert engine.running == 0 and engine.status(queued) is RequestStatus.WAITING
    tokens, ends = drive(engine)
    assert tokens[queued] == solo_tokens(llm, slm, 5, 3, 6) and ends[queued].finish_reason in ("stop", "length")
