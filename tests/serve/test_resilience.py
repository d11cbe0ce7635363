"""The server outlives its faults: a step failing again and again makes /health unhealthy without a busy loop
or a flood of logs, and recovers with the next good step; a drain shorter than the requests ends every admitted
request with a 503 JSON error or, streaming, an error event and [DONE] (never a cut stream or a plain-text 500)."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from hf_rstitch.batching.requests import Request
from hf_rstitch.serve.driver import EngineDriver
from serve.fake_engine import FakeEngine
from serve.helpers import CHAT, EOS, SCRIPT, make_app, sse_events
from serve.live import LiveServer


class Broken(FakeEngine):
    """Every step raises while ``broken`` is set."""

    broken = True
    calls = 0

    def step(self):
        self.calls += 1
        if self.broken:
            with self._lock:
                self._waiting.clear()
            raise RuntimeError("device lost")
        return super().step()


def test_failing_steps_back_off_log_once_and_mark_unhealthy(tokenizer, caplog):
    from fastapi.testclient import TestClient

    engine = Broken(SCRIPT, eos=EOS)
    app, _ = make_app(tokenizer, engine)
    caplog.set_level(logging.INFO, logger="hf_rstitch.serve")
    with TestClient(app) as c:
        for _ in range(4):  # each request fails (500, OpenAI shape); the engine keeps failing
            r = c.post("/v1/completions", json={"prompt": "Tom"})
            assert r.status_code == 500 and "device lost" in r.json()["error"]["message"]
        health = c.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "unhealthy"
        assert health.json()["failed_steps_in_a_row"] == 4
        calls = engine.calls
        time.sleep(0.3)
        assert engine.calls == calls  # nothing to do: no step, no spinning
        assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) <= 2  # the first, and "unhealthy"
        engine.broken = False
        assert c.post("/v1/completions", json={"prompt": "Tom"}).status_code == 200
        assert c.get("/health").json()["status"] == "ok"


def test_a_step_failing_with_work_left_backs_off():
    """Requests keep arriving while each step fails: the thread pauses, doubling, between failures."""
    engine = Broken(SCRIPT, eos=EOS)
    driver = EngineDriver(engine).start()
    stop = time.monotonic() + 1.0
    while time.monotonic() < stop:
        try:
            driver.submit(Request([5]), lambda ev: None)
        except Exception:  # noqa: BLE001
            pass
        time.sleep(0.005)
    driver.drain(0)
    assert 3 <= engine.calls <= 8  # 0.05 + 0.1 + 0.2 + 0.4 s of back-off in one second, not thousands of steps
    assert not driver.healthy


def _ask(url, body):
    if not body.get("stream"):
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
        return r.status_code, r.headers.get("content-type"), r.json()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
        return r.status_code, r.headers.get("content-type"), sse_events(r.iter_lines())


def test_a_short_drain_answers_every_admitted_request(tokenizer):
    engine = FakeEngine(SCRIPT * 40, eos=EOS, max_batch=4, step_s=0.05)  # ~18 s per request: longer than the drain
    app, _ = make_app(tokenizer, engine, drain_timeout_s=0.5)
    srv = LiveServer(app).__enter__()
    bodies = [{**CHAT, "stream": i % 2 == 0} for i in range(8)]  # 4 running rows, 4 waiting
    with ThreadPoolExecutor(len(bodies)) as pool:
        futures = [pool.submit(_ask, srv.url, b) for b in bodies]
        deadline = time.monotonic() + 10
        while app.state.driver.in_flight < len(bodies) and time.monotonic() < deadline:
            time.sleep(0.01)
        threading.Thread(target=srv.stop).start()  # what SIGTERM does
        answers = [f.result(timeout=30) for f in futures]
    for body, (status, kind, got) in zip(bodies, answers):
        if body["stream"]:
            assert status == 200 and got[-1] == "[DONE]", got[-3:]
            assert got[-2]["error"]["type"] == "server_shutting_down" and "shut down" in got[-2]["error"]["message"]
        else:
            assert status == 503 and kind == "application/json", got
            assert got["error"]["type"] == "server_shutting_down"
    srv.thread.join(15)
    assert not srv.thread.is_alive() and not app.state.driver.alive
