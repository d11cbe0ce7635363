"""The front end no client can stall, and the contract points an attacker probes (the scripted fake engine).

Large bodies are read off the event loop (``/health`` and streams answer while megabytes of token ids or empty
chat messages are refused); text that is not Unicode is a 400 naming its field; slow connections are timed out
and the open ones capped while a normal client is served; and the OpenAI fields each answer what OpenAI's do."""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import httpx
import pytest

from serve.fake_engine import FakeEngine
from serve.helpers import CHAT, EOS, SCRIPT, SCRIPT_TEXT, make_app, sse_events
from serve.live import LiveServer

JSON = {"content-type": "application/json"}


def _error(r, status=400):
    assert r.status_code == status, r.text
    return r.json()["error"]


@pytest.mark.parametrize("body", [{"prompt": "\ud800"}, {"prompt": ["\ud800"]}, {"prompt": "a\ud800b", "stream": True}])
def test_a_lone_surrogate_is_a_400_naming_the_prompt(client, body, caplog):
    with caplog.at_level(logging.WARNING):
        err = _error(client.post("/v1/completions", content=json.dumps(body), headers=JSON))
    assert err["param"].startswith("prompt") and "lone UTF-16 surrogate" in err["message"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # no traceback logged
    chat = {"messages": [{"role": "user", "content": "\udfff"}]}
    err = _error(client.post("/v1/chat/completions", content=json.dumps(chat), headers=JSON))
    assert err["param"] == "messages.0.content" and "surrogate" in err["message"]
    assert client.engine.submitted == []


def test_max_completion_tokens_is_reported_under_its_own_name(client):
    err = _error(client.post("/v1/chat/completions", json={**CHAT, "max_completion_tokens": 10_000}))
    assert err["param"] == "max_completion_tokens" and err["message"].startswith("max_completion_tokens=10000")


def test_response_format_text_is_served_and_json_refused(client):
    r = client.post("/v1/chat/completions", json={**CHAT, "response_format": {"type": "text"}})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == SCRIPT_TEXT
    for kind in ("json_object", "json_schema"):
        err = _error(client.post("/v1/chat/completions", json={**CHAT, "response_format": {"type": kind}}))
        assert err["param"] == "response_format" and f"response_format type {kind!r}" in err["message"]


def test_completions_logprobs_is_an_integer_refused_as_unsupported(client):
    for value in (0, 2):
        err = _error(client.post("/v1/completions", json={"prompt": "Tom", "logprobs": value}))
        assert err["param"] == "logprobs" and "returns no log probabilities" in err["message"]
    err = _error(client.post("/v1/completions", json={"prompt": "Tom", "logprobs": True}))
    assert err["param"] == "logprobs" and "valid integer" in err["message"]
    assert client.post("/v1/completions", json={"prompt": "Tom", "logprobs": None}).status_code == 200
    assert client.post("/v1/chat/completions", json={**CHAT, "logprobs": False}).status_code == 200
    assert _error(client.post("/v1/chat/completions", json={**CHAT, "logprobs": True}))["param"] == "logprobs"
    spec = client.get("/openapi.json").json()["components"]["schemas"]["CompletionRequest"]["properties"]
    assert spec["logprobs"]["anyOf"][0]["type"] == "integer"


@pytest.mark.parametrize("raw, param", [(b'{"prompt": "a", "temperature": NaN}', "temperature"),
                                        (b'{"prompt": "a", "stitch_threshold": Infinity}', "stitch_threshold"),
                                        (b'{"prompt": "a", "top_p": -Infinity}', "top_p")])
def test_non_finite_numbers_are_named_as_such(client, raw, param):
    err = _error(client.post("/v1/completions", content=raw, headers=JSON))
    assert err["param"] == param and "finite number" in err["message"]


def test_a_seed_of_thousands_of_digits_gets_the_seeds_range(client):
    err = _error(client.post("/v1/completions", content=b'{"prompt": "a", "seed": ' + b"9" * 5001 + b"}",
                             headers=JSON))
    assert err["param"] == "seed" and "a seed of 5001 digits" in err["message"] and "modulo 2**64" in err["message"]
    err = _error(client.post("/v1/completions", content=b'{"prompt": "a", "max_tokens": ' + b"7" * 5000 + b"}",
                             headers=JSON))
    assert err["param"] == "max_tokens" and "5000 digits" in err["message"]


def test_a_body_that_is_not_json_gets_the_content_type(client):
    err = _error(client.post("/v1/completions", content=b'{"prompt": "a"}', headers={"content-type": "text/plain"}))
    assert "Content-Type 'text/plain' is not JSON" in err["message"] and "application/json" in err["message"]
    assert client.post("/v1/completions", content=b'{"prompt": "a"}').status_code == 200  # none: JSON


def test_head_health_is_200(client):
    r = client.head("/health")
    assert r.status_code == 200 and r.content == b""


def test_messages_the_chat_template_drops_are_named_in_a_note(client):
    """The shipped template renders user and assistant turns only: the answer says so, once."""
    body = {"messages": [{"role": "system", "content": "be brief"}, {"role": "developer", "content": "x"},
                         *CHAT["messages"]]}
    notes = client.post("/v1/chat/completions", json=body).json()["notes"]
    assert len(notes) == 1 and "system and developer messages" in notes[0] and "messages.0, messages.1" in notes[0]
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
        events = sse_events(s.iter_lines())
    assert events[0]["notes"] == notes and not any("notes" in e for e in events[1:-1])
    assert "notes" not in client.post("/v1/chat/completions", json=CHAT).json()
    empty = {"messages": [{"role": "system", "content": ""}, *CHAT["messages"]]}  # nothing lost
    assert "notes" not in client.post("/v1/chat/completions", json=empty).json()


# ---- large bodies off the event loop --------------------------------------------------------------------------
def _ids_body() -> bytes:
    return json.dumps({"prompt": [7] * 2_000_000}, separators=(",", ":")).encode()  # 4.0 MB, under 4 MiB


def _messages_body() -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": ""}] * 123_000}).encode()  # 4.06 MB, under 4 MiB


@pytest.mark.slow
def test_large_bodies_do_not_block_health_or_streams(tokenizer):
    """Four senders of a 4 MB body each (2M token ids, 123k empty chat messages) while /health is polled and a
    stream decodes: every /health answers within 0.5 s, the stream's chunks never stop for 0.5 s, the bodies get
    their 400."""
    engine = FakeEngine(SCRIPT * 40, eos=EOS, step_s=0.01)
    app, _ = make_app(tokenizer, engine)
    ids, messages = _ids_body(), _messages_body()
    with LiveServer(app) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        assert c.post("/v1/completions", content=ids, headers=JSON).status_code == 400  # the reader process is up
        health, gaps, answers, stop = [], [], [], threading.Event()

        def poll():
            while not stop.is_set():
                t = time.perf_counter()
                assert c.get("/health").status_code == 200
                health.append(time.perf_counter() - t)
                time.sleep(0.02)

        def stream():
            body = {"prompt": "Tom", "max_tokens": 300, "stream": True}
            with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
                last = time.perf_counter()
                for _ in r.iter_lines():
                    gaps.append(time.perf_counter() - last)
                    last = time.perf_counter()

        def send(path, raw):
            with httpx.Client(timeout=60) as mine:
                answers.append(mine.post(srv.url + path, content=raw, headers=JSON))

        threads = [threading.Thread(target=poll), threading.Thread(target=stream)]
        threads += [threading.Thread(target=send, args=("/v1/completions", ids)) for _ in range(4)]
        threads += [threading.Thread(target=send, args=("/v1/chat/completions", messages)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads[1:]:
            t.join(120)
        stop.set()
        threads[0].join(10)
    assert [r.status_code for r in answers] == [400] * 8
    assert {r.json()["error"]["param"] for r in answers} == {"prompt", "messages"}
    print(json.dumps({"health_max_s": max(health), "health_n": len(health), "stream_max_gap_s": max(gaps)}))
    assert len(health) > 10 and max(health) < 0.5
    assert max(gaps) < 0.5


# ---- slow connections ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_slow_connections_are_timed_out_and_capped_while_others_are_served(tokenizer):
    """2400 connections trickling a request against a 1 s deadline and a cap of 500 open connections, each opened
    again as soon as the server sheds it, for 6 s (serve/slow_clients.py, a process of its own): none is left open
    for 5 s, the cap refuses some with a 503 (new connections past it, answered at once), and a normal client's
    completions on its open connection are served meanwhile."""
    import subprocess
    import sys

    app, _ = make_app(tokenizer, header_timeout_s=1.0, body_timeout_s=1.0, max_connections=500)
    with LiveServer(app) as srv, httpx.Client(base_url=srv.url, timeout=10) as c:
        assert c.get("/health").status_code == 200  # the normal client's connection is open (kept alive) first
        port = srv.url.rsplit(":", 1)[1]
        attack = subprocess.Popen([sys.executable, "-m", "serve.slow_clients", port, "2400", "6", "5"],
                                  cwd=os.path.dirname(os.path.dirname(__file__)), stdout=subprocess.PIPE, text=True)
        time.sleep(1.5)  # the connections are open and trickling
        latencies = []
        while attack.poll() is None and len(latencies) < 20:
            t = time.perf_counter()
            r = c.post("/v1/completions", json={"prompt": "Tom"})
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == SCRIPT_TEXT
            latencies.append(time.perf_counter() - t)
            time.sleep(0.1)
        out = json.loads(attack.communicate(timeout=120)[0])
        health = httpx.get(srv.url + "/health").json()
    latencies.sort()
    print(json.dumps({**out, "served": len(latencies), "median_latency_s": latencies[len(latencies) // 2],
                      "max_latency_s": latencies[-1]}))
    assert out["open"] == 0 and out["refused"] > 0  # every slow connection closed (deadline) or refused (cap)
    assert len(latencies) >= 5 and latencies[len(latencies) // 2] < 1.0
    assert health["status"] == "ok"
