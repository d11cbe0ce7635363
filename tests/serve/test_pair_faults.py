"""The shipped pair behind the server, fed the requests that used to break it: with --max-batch 2, two long
requests running and one queued, a seed no torch.Generator takes (>= 2**64: the server takes it modulo 2**64)
and temperatures / top_p so small they overflow all decode (the latter greedily, numerically); every innocent request equals its solo ``generate``, /health
stays ok and the engine's bookkeeping holds."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from hf_rstitch.toyworld.pair import assets_present
from serve.helpers import sse_events
from serve.live import LiveServer
from serve.pair_cases import LONGEST, SERVER_TAU, body, got, pair, solo

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not assets_present(), reason="shipped toy-world pair absent")]

ODD = [{"temperature": 0.7, "seed": 2**64}, {"temperature": 1e-45}, {"top_p": 5e-324, "temperature": 0.7},
       {"top_p": 1e-300}, {"temperature": 0.7, "seed": -2**63 - 1}]


def _stream(url, b):
    with httpx.stream("POST", url + "/v1/chat/completions", json={**b, "stream": True}, timeout=300) as r:
        events = sse_events(r.iter_lines())
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1] if "choices" in e)
    return events, text


def test_the_wedge_scenario_and_overflowing_sampling_leave_innocents_alone(one_thread):
    from hf_rstitch.serve.app import create_app
    from hf_rstitch.serve.config import ServeConfig, build_engine, settings_for

    llm, slm, tok = pair()
    cfg = ServeConfig(threshold=SERVER_TAU, max_batch=2)
    engine = build_engine(cfg, llm, slm)
    app = create_app(engine, tok, settings_for(cfg, llm))
    innocents = [(0, None, 120), (1, 0.0, 120), (2, None, 40)]  # two long rows, one queued
    with LiveServer(app) as srv, ThreadPoolExecutor(len(innocents)) as pool:
        streams = [pool.submit(_stream, srv.url, body(*case)) for case in innocents]
        deadline = time.monotonic() + 60
        while (engine.running, engine.waiting) != (2, 1) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert (engine.running, engine.waiting) == (2, 1)
        seen = odd_requests_beside(srv.url, streams)
        engine.check_consistent()
    assert_innocents_alone(innocents, *seen)


def odd_requests_beside(url: str, streams: list) -> tuple:
    """The ODD requests sent while the innocents' ``streams`` run, then what the innocents got, /health, seed 0 at
    temperature 0.7 and a plain request after them: ``(answers, results, health, again, later)``."""
    answers = [httpx.post(url + "/v1/chat/completions", json=body(3, None, 16, **odd), timeout=300) for odd in ODD]
    results = [s.result(timeout=300) for s in streams]
    health = httpx.get(url + "/health").json()
    again = httpx.post(url + "/v1/chat/completions", json=body(3, None, 16, temperature=0.7, seed=0),
                       timeout=300).json()["choices"][0]["message"]["content"]
    later = httpx.post(url + "/v1/chat/completions", json=body(4, None, 16), timeout=300)
    return answers, results, health, again, later


def assert_innocents_alone(innocents: list, answers, results, health, again, later) -> None:
    assert [a.status_code for a in answers] == [200] * len(ODD), [a.text for a in answers]
    assert answers[0].json()["choices"][0]["message"]["content"] == again  # 2**64 draws as seed 0
    greedy = solo(3, None, 16)["text"]  # tiny temperature / top_p: the most likely token each step
    assert [a.json()["choices"][0]["message"]["content"] for a in answers[1:4]] == [greedy] * 3
    for case, (events, text) in zip(innocents, results):
        assert events[-1] == "[DONE]" and text == solo(*case)["text"], case
    assert got(later.json()) == solo(4, None, 16)
    assert health["status"] == "ok" and health["last_error"] is None and health["failed_steps_in_a_row"] == 0


@pytest.mark.parametrize("layout", ["split", "one-process"])
def test_cli_sigterm_with_a_short_drain_answers_every_admitted_request(layout):
    """`rstitch serve --drain-timeout 0.2`, SIGTERM as soon as 3 plain and 3 streaming requests are admitted: the
    plain ones get a 503 JSON error, the streams an error event then [DONE]. The requests are the problems whose
    greedy answers are the shipped LLM's longest (274-290 tokens): none can end within the drain, however idle the
    machine (with a 0.5 s drain a 122-token answer once ended in time on an idle box, a 200)."""
    import signal
    import threading

    from serve.live import LAYOUTS, start_cli_server

    proc, url = start_cli_server(*LAYOUTS[layout], "--threshold", "0.0", "--max-batch", "4", "--drain-timeout", "0.2")
    try:

        def ask(i, stream):
            b = body(LONGEST[i], None, 400, stream=stream)
            if not stream:
                r = httpx.post(url + "/v1/chat/completions", json=b, timeout=120)
                return r.status_code, r.headers.get("content-type"), r.json()
            with httpx.stream("POST", url + "/v1/chat/completions", json=b, timeout=120) as r:
                return r.status_code, r.headers.get("content-type"), sse_events(r.iter_lines())

        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(ask, i, i % 2 == 1) for i in range(6)]
            deadline = time.monotonic() + 30
            while httpx.get(url + "/health", timeout=5).json()["in_flight"] < 6 and time.monotonic() < deadline:
                time.sleep(0.05)
            threading.Timer(0.05, proc.send_signal, (signal.SIGTERM,)).start()
            answers = [f.result(timeout=120) for f in futures]
        assert proc.wait(60) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    for i, (status, kind, got_) in enumerate(answers):
        if i % 2:
            assert status == 200 and got_[-1] == "[DONE]" and got_[-2]["error"]["type"] == "server_shutting_down"
        else:
            assert status == 503 and kind == "application/json" and got_["error"]["type"] == "server_shutting_down"
