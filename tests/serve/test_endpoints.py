"""The OpenAI endpoints over the scripted fake engine: bodies, streams, usage, sampling, prompts."""

from __future__ import annotations

import pytest

from serve.helpers import CHAT, SCRIPT_TEXT, sse_events

# FakeEngine roles: every third token is the LLM's -> 10 tokens (9 + EOS): S S L S S L S S L S
USAGE_STITCH = {"llm_tokens": 3, "slm_tokens": 7, "switches": 6}


def chat_ids(tokenizer, content):
    out = tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                        tokenize=True)
    return list(out["input_ids"])


def test_health_and_models(client):
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["in_flight"] == 0 and health["max_pending"] == 64
    client.post("/v1/chat/completions", json=CHAT)
    stepped = client.get("/health").json()
    assert stepped["steps"] > health["steps"] and stepped["busy_s"] > health["busy_s"] >= 0
    models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["rstitch"]


def test_chat_completion_body_and_usage(client, tokenizer):
    r = client.post("/v1/chat/completions", json={**CHAT, "stitch_threshold": 0.05})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"] == {"role": "assistant", "content": SCRIPT_TEXT}
    assert body["choices"][0]["finish_reason"] == "stop"
    ids = chat_ids(tokenizer, CHAT["messages"][0]["content"])
    assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 10, "total_tokens": len(ids) + 10,
                             **USAGE_STITCH}
    (sent,) = client.engine.submitted
    assert sent.input_ids == ids and sent.stitch_threshold == 0.05 and sent.max_new_tokens == 256
    assert sent.request_id == body["id"] and sent.do_sample is False


def test_chat_stream_matches_body(client):
    with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert {c["id"] for c in chunks} == {chunks[0]["id"]} and chunks[0]["object"] == "chat.completion.chunk"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == SCRIPT_TEXT
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "stop" and last["usage"]["completion_tokens"] == 10
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_stream_include_usage_adds_a_usage_chunk(client):
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        events = sse_events(r.iter_lines())
    assert events[-2]["choices"] == [] and events[-2]["usage"]["llm_tokens"] == USAGE_STITCH["llm_tokens"]


def test_completions_text_and_token_prompts(client, tokenizer):
    r = client.post("/v1/completions", json={"prompt": "Tom has 12 apples", "max_tokens": 4})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "So 12 +" and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 4 and body["usage"]["prompt_tokens"] == 5
    assert client.engine.submitted[-1].input_ids == tokenizer("Tom has 12 apples")["input_ids"]
    r = client.post("/v1/completions", json={"prompt": [[118, 48, 17]]})
    assert r.json()["choices"][0]["text"] == SCRIPT_TEXT and client.engine.submitted[-1].input_ids == [118, 48, 17]


def test_completions_stream(client):
    with client.stream("POST", "/v1/completions", json={"prompt": "Tom has", "stream": True}) as r:
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == SCRIPT_TEXT
    assert events[-2]["choices"][0]["finish_reason"] == "stop" and events[-2]["usage"]["switches"] == 6


@pytest.mark.parametrize("fields, want", [
    ({}, (False, 1.0, 1.0)),  # the LLM's generation config (greedy here)
    ({"temperature": 0}, (False, 1.0, 1.0)),
    ({"temperature": 0.7}, (True, 0.7, 1.0)),
    ({"temperature": 0.6, "top_p": 0.95, "seed": 7}, (True, 0.6, 0.95)),
])
def test_sampling_fields(client, fields, want):
    assert client.post("/v1/chat/completions", json={**CHAT, **fields}).status_code == 200
    sent = client.engine.submitted[-1]
    assert (sent.do_sample, sent.temperature, sent.top_p) == want and sent.seed == fields.get("seed")


def test_content_parts_and_system_message(client, tokenizer):
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "Tom has "}, {"type": "text", "text": "5"}]}]
    assert client.post("/v1/chat/completions", json={"messages": messages}).status_code == 200
    # the shipped template renders user and assistant turns only
    assert client.engine.submitted[-1].input_ids == chat_ids(tokenizer, "Tom has 5")


def test_concurrent_requests_share_the_batch(tokenizer):
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from serve.fake_engine import FakeEngine
    from serve.helpers import EOS, SCRIPT, make_app
    from serve.live import LiveServer

    engine = FakeEngine(SCRIPT, eos=EOS, max_batch=4, step_s=0.01)
    app, _ = make_app(tokenizer, engine)
    with LiveServer(app) as srv, ThreadPoolExecutor(8) as pool:
        def ask(i):
            body = {"prompt": [118, 48, 17 + i % 5], "max_tokens": 4 + i % 7}
            return httpx.post(srv.url + "/v1/completions", json=body, timeout=20).json()

        bodies = list(pool.map(ask, range(8)))
    assert engine.max_running == 4 and len(engine.submitted) == 8
    for i, body in enumerate(bodies):
        n = min(4 + i % 7, 10)
        assert body["usage"]["completion_tokens"] == n
        assert body["choices"][0]["finish_reason"] == ("stop" if n == 10 else "length")
