"""The shipped pair in ``rstitch serve``'s default layout -- the engine in a process of its own, the app over its
client (``serve.frontends.split_app``) -- answers as the one-process server of test_pair_e2e, test_pair_faults and
test_policy_requests does: every greedy answer equals its solo ``generate`` (stitched, per-request policies, the
router, pinned), a client that leaves frees its row, and the requests that used to break the server leave the
innocent ones alone. What those tests read from the engine object (``engine.running``, ``check_consistent()``) a
front end cannot reach: it reads /health, which the engine process fills."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from hf_rstitch.toyworld.pair import assets_present
from serve.helpers import sse_events
from serve.live import LiveServer, split_app
from serve.pair_cases import CASES, LONGEST, SERVER_TAU, body, got, pair, problem, solo

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not assets_present(), reason="shipped toy-world pair absent")]


def _ask_all(url: str, cases: list, **extra) -> list[dict]:
    with ThreadPoolExecutor(len(cases)) as pool:
        def ask(case):
            r = httpx.post(url + "/v1/chat/completions", json=body(*case, **extra), timeout=120)
            assert r.status_code == 200, r.text
            return got(r.json())

        return list(pool.map(ask, cases))


def test_concurrent_requests_and_their_own_policies_equal_solo_generate(one_thread):
    from hf_rstitch.serve.config import ServeConfig
    from serve.test_policy_requests import SPECS, solo_with

    with split_app(ServeConfig(threshold=SERVER_TAU, max_batch=4)) as app, LiveServer(app) as srv:
        answers = _ask_all(srv.url, CASES)  # 6 requests, 4 rows: some wait for a row
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body(*CASES[0], stream=True),
                          timeout=120) as r:
            chunks = sse_events(r.iter_lines())[:-1]
        with ThreadPoolExecutor(len(SPECS)) as pool:  # a policy object crosses the socket inside its request
            routed = list(pool.map(lambda c: got(httpx.post(
                srv.url + "/v1/chat/completions", timeout=120,
                json=body(c[0], None, c[2], **({"stitch_policy": c[1]} if c[1] else {}))).json()), SPECS))
    for case, answer in zip(CASES, answers):
        assert answer == solo(*case), case
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert streamed == answers[0]["text"] and chunks[-1]["usage"]["llm_tokens"] == answers[0]["llm_tokens"]
    for case, answer in zip(SPECS, routed):
        assert answer == solo_with(*case), case


def test_router_serving_equals_solo_generate_with_the_router(one_thread):
    from hf_rstitch.serve.config import ServeConfig
    from hf_rstitch.toyworld.pair import ASSETS

    router = str(ASSETS.parent / "router")
    cases = [(i, None, m) for i, _, m in CASES[:4]]
    with split_app(ServeConfig(router=router, max_batch=2)) as app, LiveServer(app) as srv:
        answers = _ask_all(srv.url, cases)
        refused = httpx.post(srv.url + "/v1/chat/completions", json=body(0, 0.1, 8), timeout=60)
        health = httpx.get(srv.url + "/health").json()
    for case, answer in zip(cases, answers):
        assert answer == solo(*case, router=router), case
    assert refused.status_code == 400 and "drop stitch_threshold" in refused.json()["error"]["message"]
    assert health["router"] == router and health["threshold"] is None
    most = max(a["llm_tokens"] for a in answers)  # each of a request's LLM tokens took a step of its own
    assert 0 < most <= health["llm_calls"] <= health["steps"]  # steps the LLM ran in, from the engine's figures


def test_a_request_names_the_engine_processes_router_at_its_own_threshold(one_thread):
    """The front end sends the name and threshold (no weights); the engine process routes the row with its router."""
    from hf_rstitch.serve.config import ServeConfig
    from hf_rstitch.toyworld.pair import ASSETS

    router = str(ASSETS.parent / "router")
    with split_app(ServeConfig(router=router, max_batch=2)) as app, LiveServer(app) as srv:
        answer = httpx.post(srv.url + "/v1/chat/completions", timeout=120,
                            json=body(1, None, 32, stitch_policy={"name": "router", "threshold": 0.0})).json()
        r2r = httpx.post(srv.url + "/v1/chat/completions", timeout=60,
                         json=body(0, None, 8, stitch_policy={"name": "r2r", "threshold": 0.5}))
    assert got(answer) == solo(1, 0.0, 32, router=router)
    assert r2r.status_code == 400 and "--router" in r2r.json()["error"]["message"]


@pytest.mark.parametrize("pin", ["llm", "slm"])
def test_pinned_server_equals_each_model_alone(one_thread, pin):
    import torch

    from hf_rstitch.eval.data import prompt_ids
    from hf_rstitch.serve.config import ServeConfig

    llm, slm, tok = pair()
    model = llm if pin == "llm" else slm
    cases = [(i, None, m) for i, _, m in CASES[:3]]
    with split_app(ServeConfig(pin=pin, max_batch=2)) as app, LiveServer(app) as srv:
        answers = _ask_all(srv.url, cases)
    for (i, _, m), answer in zip(cases, answers):
        ids = torch.tensor([prompt_ids(tok, problem(i), instruction="")])
        want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=m)
        assert answer["text"] == tok.decode(want[0, ids.shape[1]:].tolist(), skip_special_tokens=True), (pin, i)
        assert answer[f"{'slm' if pin == 'llm' else 'llm'}_tokens"] == 0 and answer["switches"] == 0, answer


def test_disconnect_frees_the_engine_processes_row(one_thread):
    from hf_rstitch.serve.config import ServeConfig

    with split_app(ServeConfig(threshold=0.0, max_batch=2)) as app, LiveServer(app) as srv:
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body(LONGEST[0], None, 400, stream=True),
                          timeout=60) as r:  # tau 0: the LLM writes all 290 tokens
            for n, _ in enumerate(r.iter_lines()):
                if n == 4:
                    break
        deadline, health = time.monotonic() + 10, {}
        while time.monotonic() < deadline:
            health = httpx.get(srv.url + "/health").json()
            if health["running"] == 0 and health["in_flight"] == 0:
                break
            time.sleep(0.05)
        assert health["running"] == 0 and health["in_flight"] == 0, health
        assert health["completed"] == 0  # cancelled, not run to its 290 tokens
        assert httpx.post(srv.url + "/v1/chat/completions", json=body(1, None, 8), timeout=60).status_code == 200


def test_the_wedge_scenario_and_overflowing_sampling_leave_innocents_alone(one_thread):
    from hf_rstitch.serve.config import ServeConfig
    from serve.test_pair_faults import _stream, assert_innocents_alone, odd_requests_beside

    innocents = [(0, None, 120), (1, 0.0, 120), (2, None, 40)]  # two long rows, one queued
    with split_app(ServeConfig(threshold=SERVER_TAU, max_batch=2)) as app, LiveServer(app) as srv, \
            ThreadPoolExecutor(len(innocents)) as pool:
        streams = [pool.submit(_stream, srv.url, body(*case)) for case in innocents]
        deadline, health = time.monotonic() + 60, {}
        while (health.get("running"), health.get("waiting")) != (2, 1) and time.monotonic() < deadline:
            health = httpx.get(srv.url + "/health").json()
            time.sleep(0.005)
        assert (health["running"], health["waiting"]) == (2, 1), health
        seen = odd_requests_beside(srv.url, streams)
    assert_innocents_alone(innocents, *seen)
