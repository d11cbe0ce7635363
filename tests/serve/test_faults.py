"""Faults stay with their request: bad bodies are 400s, a full server 429, a draining one 503,
a client that leaves frees its row, a failed engine step fails only the requests in flight, and
shutdown (what uvicorn does on SIGTERM) lets running requests finish."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from serve.fake_engine import FakeEngine
from serve.helpers import CHAT, EOS, SCRIPT, SCRIPT_TEXT, make_app, sse_events
from serve.live import LiveServer


def _wait(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.parametrize("path, body, needle", [
    ("/v1/chat/completions", {**CHAT, "stich_threshold": 0.1}, "stich_threshold: Extra inputs are not permitted"),
    ("/v1/chat/completions", {**CHAT, "stitch_threshold": 1.5}, "stitch_threshold: Input should be less than or"),
    ("/v1/chat/completions", {**CHAT, "n": 2}, "n=2 (only n=1)"),
    ("/v1/chat/completions", {**CHAT, "stop": ["a", "b", "c", "d", "e"]}, "stop: List should have at most 4 items"),
    ("/v1/chat/completions", {"messages": []}, "messages: List should have at least 1 item"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "only text content parts are supported"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 760}, "ask for at most"),
    ("/v1/completions", {"prompt": "Tom " * 800},
     "tokens but the model reads at most 768 (its max_position_embeddings)"),
    ("/v1/completions", {"prompt": [5, 131]}, "prompt token ids must lie in [0, 131), got [131]"),
    ("/v1/completions", {"prompt": ["a", "b"]}, "send one prompt per request"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1"),
])
def test_bad_requests_fail_alone_with_400(client, path, body, needle):
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"] and r.json()["error"]["type"] == "invalid_request_error"
    assert client.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]["content"] == SCRIPT_TEXT


def test_engine_refusal_is_400(tokenizer):
    from fastapi.testclient import TestClient

    app, _ = make_app(tokenizer, FakeEngine(SCRIPT, eos=EOS, vocab=100), vocab_size=None)  # the engine checks ids
    with TestClient(app) as c:
        r = c.post("/v1/completions", json={"prompt": [120]})
    assert r.status_code == 400 and "the engine refused the request: input_ids must be" in r.json()["error"]["message"]


def _stream_first_chunks(url, body, n, out, stop_after=True):
    """Open a streaming request, read ``n`` chunks, then drop the connection (or read it all)."""
    with httpx.Client(timeout=10) as c, c.stream("POST", url + "/v1/chat/completions", json=body) as r:
        out.append(r.status_code)
        lines = []
        for line in r.iter_lines():
            lines.append(line)
            if stop_after and len([x for x in lines if x.startswith("data:")]) >= n:
                break
        out.append(sse_events(lines))


def test_queue_limit_answers_429_then_recovers(tokenizer):
    engine = FakeEngine(SCRIPT, eos=EOS, max_batch=1, step_s=0.05, max_waiting=0)  # the engine's one limit: 1
    app, _ = make_app(tokenizer, engine)
    with LiveServer(app) as srv:
        first: list = []
        t = threading.Thread(target=_stream_first_chunks, args=(srv.url, {**CHAT, "stream": True}, 0, first, False))
        t.start()
        assert _wait(lambda: engine.running == 1)
        r = httpx.post(srv.url + "/v1/chat/completions", json=CHAT, timeout=10)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert "the server is at capacity: 1 requests in flight (limit 1" in r.json()["error"]["message"]
        t.join(10)
        assert first[0] == 200 and first[1][-1] == "[DONE]"
        assert httpx.post(srv.url + "/v1/chat/completions", json=CHAT, timeout=10).status_code == 200


def test_stream_disconnect_cancels_the_row(tokenizer):
    engine = FakeEngine(SCRIPT * 20, eos=EOS, step_s=0.02)
    app, _ = make_app(tokenizer, engine)
    with LiveServer(app) as srv:
        out: list = []
        _stream_first_chunks(srv.url, {**CHAT, "stream": True}, 3, out)
        assert _wait(lambda: engine.cancelled == [engine.submitted[0].request_id])
        assert _wait(lambda: app.state.driver.in_flight == 0 and not engine.has_work())


def test_non_stream_disconnect_cancels_the_row(tokenizer):
    engine = FakeEngine(SCRIPT * 20, eos=EOS, step_s=0.02)
    app, _ = make_app(tokenizer, engine)
    with LiveServer(app) as srv:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(srv.url + "/v1/chat/completions", json=CHAT, timeout=0.5)
        assert _wait(lambda: engine.cancelled == [engine.submitted[0].request_id])
        assert len(engine.submitted[0].input_ids) > 0 and app.state.driver.in_flight == 0


def test_failed_step_fails_requests_in_flight_only(tokenizer):
    from fastapi.testclient import TestClient

    app, _ = make_app(tokenizer, FakeEngine(SCRIPT, eos=EOS, poison=131 - 1))
    with TestClient(app) as c:
        r = c.post("/v1/completions", json={"prompt": [118, 130]})
        assert r.status_code == 500
        message = r.json()["error"]["message"]
        assert "the engine failed while decoding this batch (RuntimeError: poisoned batch)" in message
        assert c.get("/health").json()["last_error"] == "RuntimeError: poisoned batch"
        assert c.post("/v1/completions", json={"prompt": [118]}).json()["choices"][0]["text"] == SCRIPT_TEXT


def test_shutdown_drains_running_requests_and_refuses_new(tokenizer):
    engine = FakeEngine(SCRIPT, eos=EOS, step_s=0.1)  # 10 steps: ~1 s per request
    app, _ = make_app(tokenizer, engine, drain_timeout_s=10)
    srv = LiveServer(app).__enter__()
    out: list = []
    t = threading.Thread(target=_stream_first_chunks, args=(srv.url, {**CHAT, "stream": True}, 0, out, False))
    t.start()
    assert _wait(lambda: engine.running == 1)
    srv.stop()  # uvicorn's SIGTERM path
    t.join(10)
    assert out[0] == 200 and out[1][-1] == "[DONE]"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in out[1][:-1]) == SCRIPT_TEXT
    assert not srv.thread.is_alive() and not app.state.driver.alive
    with pytest.raises(httpx.ConnectError):
        httpx.post(srv.url + "/v1/chat/completions", json=CHAT, timeout=2)


def test_draining_driver_answers_503(client):
    client.app.state.driver.drain(timeout_s=0)
    r = client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"]
    assert client.get("/health").status_code == 503
