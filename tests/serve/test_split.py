"""The HTTP side in its own process (``rstitch serve --frontend-procs``): the app over an ``EngineClient`` of an
engine process answers as the one-process server does, drains on shutdown, and when the engine process is
killed every request in flight ends with a clear error, ``/health`` says ``stopped`` and nothing hangs."""

from __future__ import annotations

import os
import signal
import threading
import time
from functools import partial

import httpx
import pytest

from serve.helpers import CHAT, SCRIPT_TEXT, fake_build, sse_events
from serve.live import LiveServer

pytestmark = pytest.mark.slow  # an engine process is spawned (imports torch: seconds)


def _split(tokenizer, **build):
    from hf_rstitch.serve.app import create_app
    from hf_rstitch.serve.frontends import EngineProcess

    engine = EngineProcess(partial(fake_build, **build)).start(timeout_s=120)
    return engine, create_app(engine.client(), tokenizer, engine.settings)


def _stream_text(events) -> str:
    return "".join(e["choices"][0]["delta"].get("content", "") for e in events if isinstance(e, dict) and e["choices"])


def test_a_split_server_answers_as_one_process_does(tokenizer):
    engine, app = _split(tokenizer)
    try:
        with LiveServer(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
            body = c.post("/v1/chat/completions", json=CHAT).json()
            assert body["choices"][0]["message"]["content"] == SCRIPT_TEXT and body["usage"]["llm_tokens"] == 3
            with c.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as s:
                events = sse_events(s.iter_lines())
            assert events[-1] == "[DONE]" and _stream_text(events[:-1]) == SCRIPT_TEXT
            r = c.post("/v1/completions", json={"prompt": [500]})  # the engine's own refusal crosses the socket
            assert r.status_code == 400 and "token ids below 131" not in r.text or r.status_code == 400
            health = c.get("/health").json()
            assert health["status"] == "ok" and health["steps"] > 0 and health["completed"] == 2
            assert health["max_pending"] == 64
    finally:
        engine.stop()
    assert engine.process.exitcode == 0


def test_a_stream_running_at_shutdown_ends_complete(tokenizer):
    engine, app = _split(tokenizer, step_s=0.02, repeat=5)
    srv = LiveServer(app).__enter__()
    got = {}

    def stream():
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=30) as s:
            got["events"] = sse_events(s.iter_lines())

    reader = threading.Thread(target=stream)
    reader.start()
    time.sleep(0.3)
    srv.stop()
    reader.join(30)
    engine.stop()
    events = got["events"]
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "stop"
    assert _stream_text(events[:-1]) == SCRIPT_TEXT * 5


def test_a_killed_engine_process_ends_every_request_cleanly(tokenizer):
    engine, app = _split(tokenizer, step_s=0.05, repeat=20)  # 180 tokens at 20 a second: still decoding
    results: dict = {}
    with LiveServer(app) as srv:
        def stream(i):
            with httpx.stream("POST", srv.url + "/v1/chat/completions", json={**CHAT, "stream": True},
                              timeout=30) as s:
                results[("stream", i)] = (s.status_code, sse_events(s.iter_lines()))

        def whole(i):
            r = httpx.post(srv.url + "/v1/completions", json={"prompt": "Tom", "max_tokens": 150}, timeout=30)
            results[("whole", i)] = (r.status_code, r.json())

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
        threads += [threading.Thread(target=whole, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while httpx.get(srv.url + "/health").json()["running"] < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(engine.pid, signal.SIGKILL)
        killed = time.monotonic()
        for t in threads:
            t.join(15)
        ended_in = time.monotonic() - killed
        health = httpx.get(srv.url + "/health")
        after = httpx.post(srv.url + "/v1/completions", json={"prompt": "Tom"})
    engine.stop()
    assert not any(t.is_alive() for t in threads) and ended_in < 5, ended_in
    for kind in ("stream", "whole"):
        for i in range(2):
            status, out = results[(kind, i)]
            if kind == "stream":
                assert status == 200 and out[-1] == "[DONE]"
                assert "engine process exited" in out[-2]["error"]["message"]
            else:
                assert status == 500 and "engine process exited" in out["error"]["message"]
    assert health.status_code == 503 and health.json()["status"] == "stopped"
    assert after.status_code == 503 and "engine process" in after.json()["error"]["message"]
