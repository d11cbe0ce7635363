"""The shipped pair end to end: concurrent requests share the real request engine's batch and each
greedy answer equals its solo ``generate`` (text and stitch counts); ``rstitch serve`` drains a
running request on SIGTERM."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from hf_rstitch.toyworld.pair import assets_present
from serve.helpers import sse_events
from serve.live import LAYOUTS, LiveServer, start_cli_server
from serve.pair_cases import CASES, LONGEST, SERVER_TAU, body, got, pair, problem, solo

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not assets_present(), reason="shipped toy-world pair absent")]


def test_concurrent_requests_equal_solo_generate(one_thread):
    from hf_rstitch.batching.requests import RequestEngine
    from hf_rstitch.serve.app import create_app
    from hf_rstitch.serve.config import ServeConfig, settings_for

    llm, slm, tok = pair()
    engine = RequestEngine.of(llm, slm, threshold=SERVER_TAU, max_batch=4)  # 6 requests: some wait for a row
    app = create_app(engine, tok, settings_for(ServeConfig(threshold=SERVER_TAU, max_batch=4), llm))
    with LiveServer(app) as srv, ThreadPoolExecutor(len(CASES)) as pool:
        def ask(case):
            r = httpx.post(srv.url + "/v1/chat/completions", json=body(*case), timeout=120)
            assert r.status_code == 200, r.text
            return got(r.json())

        answers = list(pool.map(ask, CASES))
        # and one streamed: the concatenated deltas are the same text
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body(*CASES[0], stream=True),
                          timeout=120) as r:
            chunks = sse_events(r.iter_lines())[:-1]
    for case, answer in zip(CASES, answers):
        assert answer == solo(*case), case
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert streamed == answers[0]["text"] and chunks[-1]["usage"]["llm_tokens"] == answers[0]["llm_tokens"]


def test_router_serving_equals_solo_generate_with_the_router(one_thread):
    from hf_rstitch.serve.app import create_app
    from hf_rstitch.serve.config import ServeConfig, build_engine, settings_for
    from hf_rstitch.toyworld.pair import ASSETS

    router = str(ASSETS.parent / "router")
    llm, slm, tok = pair()
    cfg = ServeConfig(router=router, max_batch=2)
    app = create_app(build_engine(cfg, llm, slm), tok, settings_for(cfg, llm))
    cases = [(i, None, m) for i, _, m in CASES[:4]]
    with LiveServer(app) as srv, ThreadPoolExecutor(len(cases)) as pool:
        answers = list(pool.map(lambda c: httpx.post(srv.url + "/v1/chat/completions", json=body(*c), timeout=120)
                                .json(), cases))
        refused = httpx.post(srv.url + "/v1/chat/completions", json=body(0, 0.1, 8), timeout=60)
        health = httpx.get(srv.url + "/health").json()
    for case, answer in zip(cases, answers):
        assert got(answer) == solo(*case, router=router), case
    assert refused.status_code == 400 and "drop stitch_threshold" in refused.json()["error"]["message"]
    assert health["router"] == router and health["threshold"] is None


def test_a_request_names_the_servers_router_at_its_own_threshold(one_thread):
    """``stitch_policy: {"name": "router", "threshold": t}`` on a server started with --router answers what solo
    generate with that router at tau t answers, beside requests at the server's default; naming an R2R router
    the server has not is a 400 that names --router."""
    from hf_rstitch.serve.app import create_app
    from hf_rstitch.serve.config import ServeConfig, build_engine, settings_for
    from hf_rstitch.toyworld.pair import ASSETS

    router = str(ASSETS.parent / "router")
    llm, slm, tok = pair()
    cfg = ServeConfig(router=router, max_batch=3)
    app = create_app(build_engine(cfg, llm, slm), tok, settings_for(cfg, llm))
    cases = [(0, 0.0, 32), (1, 0.2, 32), (2, None, 32)]

    def ask(srv, case):
        i, tau, m = case
        extra = {} if tau is None else {"stitch_policy": {"name": "router", "threshold": tau}}
        return httpx.post(srv.url + "/v1/chat/completions", json=body(i, None, m, **extra), timeout=120).json()

    with LiveServer(app) as srv, ThreadPoolExecutor(len(cases)) as pool:
        answers = list(pool.map(lambda c: ask(srv, c), cases))
        r2r = httpx.post(srv.url + "/v1/chat/completions", timeout=60,
                         json=body(0, None, 8, stitch_policy={"name": "r2r", "threshold": 0.5}))
    for case, answer in zip(cases, answers):
        assert got(answer) == solo(*case, router=router), case
    assert got(answers[0])["llm_tokens"] > got(answers[1])["llm_tokens"]  # the request's own tau routed it
    assert r2r.status_code == 400 and "--router" in r2r.json()["error"]["message"]


def test_disconnect_frees_the_real_engines_row(one_thread):
    from hf_rstitch.batching.requests import RequestEngine
    from hf_rstitch.serve.app import create_app
    from hf_rstitch.serve.config import ServeConfig, settings_for

    llm, slm, tok = pair()
    engine = RequestEngine.of(llm, slm, threshold=0.0, max_batch=2)  # tau 0: the LLM writes all 290 tokens
    app = create_app(engine, tok, settings_for(ServeConfig(threshold=0.0, max_batch=2), llm))
    with LiveServer(app) as srv:
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body(LONGEST[0], None, 400, stream=True),
                          timeout=60) as r:
            for n, _ in enumerate(r.iter_lines()):
                if n == 4:
                    break
        deadline = time.monotonic() + 10
        while (engine.running or app.state.driver.in_flight) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.running == 0 and app.state.driver.in_flight == 0
        assert app.state.driver.completed == 0  # cancelled, not run to its 290 tokens
        assert httpx.post(srv.url + "/v1/chat/completions", json=body(1, None, 8), timeout=60).status_code == 200


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cli_serve_drains_on_sigterm(layout):
    proc, url = start_cli_server(*LAYOUTS[layout], "--threshold", "0.0")
    try:
        lines = []
        # tau 0: every token from the LLM, 290 of them: long enough to be running at SIGTERM
        with httpx.stream("POST", url + "/v1/chat/completions", timeout=120,
                          json=body(LONGEST[0], None, 400, stream=True)) as r:
            for line in r.iter_lines():
                lines.append(line)
                if len(lines) == 3:
                    proc.send_signal(signal.SIGTERM)
        events = sse_events(lines)
        assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] in ("stop", "length")
        # uvicorn re-raises the captured SIGTERM once it has shut down gracefully
        assert proc.wait(60) in (0, -signal.SIGTERM)
        assert "Finished server process" in proc.stdout.read()
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_pinned_server_equals_each_model_alone(one_thread):
    """``rstitch serve --pin llm`` (the baseline stitched serving is measured against): every answer is the LLM's
    plain greedy ``generate``, the SLM writes nothing; ``--pin slm`` likewise the SLM's."""
    import torch

    from hf_rstitch.eval.data import prompt_ids
    from hf_rstitch.serve.app import create_app
    from hf_rstitch.serve.config import ServeConfig, build_engine, settings_for

    llm, slm, tok = pair()
    cases = [(i, None, m) for i, _, m in CASES[:3]]
    for pin, model in (("llm", llm), ("slm", slm)):
        cfg = ServeConfig(pin=pin, max_batch=2)
        app = create_app(build_engine(cfg, llm, slm), tok, settings_for(cfg, llm))
        with LiveServer(app) as srv, ThreadPoolExecutor(len(cases)) as pool:
            answers = list(pool.map(lambda c: got(httpx.post(srv.url + "/v1/chat/completions", json=body(*c),
                                                             timeout=120).json()), cases))
        for (i, _, m), answer in zip(cases, answers):
            ids = torch.tensor([prompt_ids(tok, problem(i), instruction="")])
            want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=m)
            assert answer["text"] == tok.decode(want[0, ids.shape[1]:].tolist(), skip_special_tokens=True), (pin, i)
            assert answer[f"{'slm' if pin == 'llm' else 'llm'}_tokens"] == 0 and answer["switches"] == 0, answer
