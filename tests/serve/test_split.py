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
    engine, app = _split(tokenizer, engine_vocab=131, vocab_size=None)  # the engine, not the app, checks ids
    try:
        with LiveServer(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
            body = c.post("/v1/chat/completions", json=CHAT).json()
            assert body["choices"][0]["message"]["content"] == SCRIPT_TEXT and body["usage"]["llm_tokens"] == 3
            with c.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as s:
                events = sse_events(s.iter_lines())
            assert events[-1] == "[DONE]" and _stream_text(events[:-1]) == SCRIPT_TEXT
            r = c.post("/v1/completions", json={"prompt": [200]})  # the engine's own refusal crosses the socket
            assert r.status_code == 400 and "token ids below 131" in r.json()["error"]["message"]
            health = c.get("/health").json()
            assert health["status"] == "ok" and health["steps"] > 0 and health["completed"] == 2
            assert health["max_pending"] == 64 and 0 < health["busy_s"] < 30  # the engine thread's stepping time
            assert health["llm_calls"] is None  # this stand-in engine keeps no stats (the pair's: test_split_pair)
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
    deadline = time.monotonic() + 20  # stop once the stream is decoding, however loaded the box
    while httpx.get(srv.url + "/health").json()["running"] < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
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


@pytest.mark.parametrize("argv, needle", [
    (["--frontend-procs", "-1"], "--frontend-procs must be >= 0 (0: one process), got -1"),
    (["--frontend-procs", "2", "--replicas", "2"], "--frontend-procs runs one server's HTTP side"),
])
def test_bad_frontend_flags_exit_2_with_a_message(argv, needle, capsys):
    from hf_rstitch.cli.main import main

    assert main(["serve", *argv]) == 2
    assert needle in capsys.readouterr().err


def test_rstitch_serve_frontend_procs_answers_equal_solo_generate():
    """The CLI on the shipped pair with two front-end processes: greedy answers equal solo generate, SIGTERM
    drains and every process exits."""
    from hf_rstitch.toyworld.pair import assets_present
    from serve.live import start_cli_server
    from serve.pair_cases import CASES, SERVER_TAU, body, got, solo

    if not assets_present():
        pytest.skip("shipped toy-world pair absent")
    proc, url = start_cli_server("--frontend-procs", "2", "--threshold", str(SERVER_TAU), timeout=400)
    try:
        pids, deadline = set(), time.monotonic() + 300
        while len(pids) < 2 and time.monotonic() < deadline:  # a fresh connection each: the kernel picks a process
            health = httpx.get(url + "/health", timeout=10).json()
            assert health["status"] == "ok"
            pids.add(health["pid"])
            time.sleep(0.05)
        assert len(pids) == 2  # both front ends serve the port
        for case in CASES[:3]:
            r = httpx.post(url + "/v1/chat/completions", json=body(*case), timeout=120)
            assert got(r.json()) == solo(*case)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
    assert code in (0, -signal.SIGTERM)  # uvicorn re-raises the captured SIGTERM once it has shut down
    out = proc.stdout.read()
    assert out.count("Finished server process") == 2, out[-3000:]  # both front ends drained and finished
