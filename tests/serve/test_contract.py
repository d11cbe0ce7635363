"""The OpenAI contract over the scripted fake engine: errors always in OpenAI's shape, strict types, unknown
models, stop strings (also split across tokens, also streamed), the body size limit, tokenization off the event
loop, and a published schema that says what the server answers."""

from __future__ import annotations

import asyncio

import pytest

from serve.helpers import CHAT, SCRIPT_TEXT, make_app, sse_events

# SCRIPT_TEXT == "So 12 + 7 = 19."


def _is_openai_error(r, status):
    body = r.json()
    assert r.status_code == status, r.text
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


@pytest.mark.parametrize("content, kwargs, status, needle", [
    (b'{"prompt": "\xff\xfe"}', {}, 400, "send a JSON object in UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, {}, 400, "send a JSON object"),
    (b'{"prompt": ', {}, 400, "the body is not valid JSON"),
    (b"prompt=hello", {"headers": {"content-type": "application/x-www-form-urlencoded"}}, 400, "invalid request body"),
])
def test_unparsable_bodies_are_openai_400s(client, content, kwargs, status, needle):
    headers = {"content-type": "application/json", **kwargs.get("headers", {})}
    r = client.post("/v1/completions", content=content, headers=headers)
    assert needle in _is_openai_error(r, status)["message"]


def test_unknown_routes_and_methods_are_openai_errors(client):
    assert "no route /v1/nothing" in _is_openai_error(client.get("/v1/nothing"), 404)["message"]
    r = client.get("/v1/completions")
    assert "GET is not allowed on /v1/completions" in _is_openai_error(r, 405)["message"]
    assert r.headers["allow"] == "POST"


@pytest.mark.parametrize("field, value", [("max_tokens", True), ("stream", "yes"), ("stitch_threshold", True),
                                          ("prompt", [True, False]), ("temperature", "0"), ("seed", "1"),
                                          ("seed", 1.5), ("stop", 7)])
def test_types_are_strict(client, field, value):
    r = client.post("/v1/completions", json={"prompt": "Tom", field: value})
    assert _is_openai_error(r, 400)["param"] == field
    assert client.engine.submitted == []


def test_unknown_models_are_404_and_aliases_are_served(tokenizer):
    from fastapi.testclient import TestClient

    app, _ = make_app(tokenizer, model_name="toy", model_aliases=("toy-alias",))
    with TestClient(app) as c:
        err = _is_openai_error(c.post("/v1/chat/completions", json={**CHAT, "model": "gpt-4o"}), 404)
        assert err["code"] == "model_not_found" and err["param"] == "model" and "'toy', 'toy-alias'" in err["message"]
        for name in ("toy", "toy-alias", None):
            r = c.post("/v1/chat/completions", json={**CHAT, "model": name})
            assert r.status_code == 200 and r.json()["model"] == "toy"
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["toy", "toy-alias"]


def test_any_integer_seed_is_taken_modulo_2_64(client):
    for seed, engine_seed in ((2**64 + 5, 5), (-1, 2**64 - 1), (10**30, 10**30 % 2**64)):
        assert client.post("/v1/completions", json={"prompt": "Tom", "seed": seed, "temperature": 0.5}).status_code == 200
        assert client.engine.submitted[-1].seed == engine_seed


def test_n_above_one_is_a_400_naming_it(client):
    err = _is_openai_error(client.post("/v1/chat/completions", json={**CHAT, "n": 2}), 400)
    assert "n=2 (only n=1)" in err["message"]
    assert client.post("/v1/chat/completions", json={**CHAT, "n": 1}).status_code == 200


def test_an_empty_prompt_starts_from_bos(client, tokenizer):
    r = client.post("/v1/completions", json={"prompt": ""})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == SCRIPT_TEXT
    assert client.engine.submitted[0].input_ids == [tokenizer.bos_token_id]


@pytest.mark.parametrize("stop, text", [
    ("+ 7", "So 12 "),  # across tokens "+" and "7"
    (["=", "12"], "So "),  # the earliest of several
    ("2 +", "So 1"),  # inside a token
    ("19.", "So 12 + 7 = "),
    ("nowhere", SCRIPT_TEXT),
    ("", SCRIPT_TEXT),
])
def test_stop_strings_end_the_text_before_them(client, stop, text):
    r = client.post("/v1/completions", json={"prompt": "Tom", "stop": stop})
    choice = r.json()["choices"][0]
    assert choice["text"] == text and choice["finish_reason"] == "stop"
    with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stop": stop, "stream": True}) as s:
        events = sse_events(s.iter_lines())
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "stop"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == text
    streamed = []
    with client.stream("POST", "/v1/completions", json={"prompt": "Tom", "stop": stop, "stream": True}) as s:
        streamed = sse_events(s.iter_lines())
    assert "".join(e["choices"][0]["text"] for e in streamed[:-1]) == text


def test_a_stop_string_frees_the_row(tokenizer):
    from fastapi.testclient import TestClient

    from serve.fake_engine import FakeEngine
    from serve.helpers import EOS, SCRIPT

    engine = FakeEngine(SCRIPT * 30, eos=EOS, step_s=0.02)  # 270 tokens: still decoding when the stop string shows
    app, _ = make_app(tokenizer, engine)
    with TestClient(app) as c:
        r = c.post("/v1/completions", json={"prompt": "Tom", "stop": "=", "max_tokens": 200})
        assert r.json()["choices"][0]["text"] == "So 12 + 7 "
        import time

        end = time.monotonic() + 5
        while engine.has_work() and time.monotonic() < end:
            time.sleep(0.01)
        assert engine.cancelled == [engine.submitted[0].request_id] and not engine.has_work()


def test_bodies_over_the_limit_are_413(tokenizer):
    from fastapi.testclient import TestClient

    app, engine = make_app(tokenizer, max_body_bytes=1000)
    with TestClient(app) as c:
        err = _is_openai_error(c.post("/v1/completions", json={"prompt": "Tom " * 500}), 413)
        assert "takes at most 1000" in err["message"]

        def chunks():  # no Content-Length: counted while it arrives
            yield b'{"prompt": "'
            for _ in range(100):
                yield b"Tom " * 10
            yield b'"}'

        r = c.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
        assert "takes at most 1000" in _is_openai_error(r, 413)["message"]
        assert c.post("/v1/completions", json={"prompt": "Tom"}).status_code == 200
    assert len(engine.submitted) == 1


class WatchedTokenizer:
    """The pair's tokenizer, recording whether each call ran on a thread with a running event loop."""

    def __init__(self, tok):
        self._tok, self.calls = tok, []

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def _on_loop(self) -> bool:
        try:
            asyncio.get_running_loop()
            return True
        except RuntimeError:
            return False

    def __call__(self, *a, **k):
        self.calls.append(self._on_loop())
        return self._tok(*a, **k)

    def apply_chat_template(self, *a, **k):
        self.calls.append(self._on_loop())
        return self._tok.apply_chat_template(*a, **k)


def test_tokenization_runs_off_the_event_loop_and_long_prompts_are_refused_untokenized(tokenizer):
    from fastapi.testclient import TestClient

    watched = WatchedTokenizer(tokenizer)
    app, _ = make_app(watched)
    with TestClient(app) as c:
        assert c.post("/v1/completions", json={"prompt": "Tom"}).status_code == 200
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert watched.calls == [False, False]
        r = c.post("/v1/completions", json={"prompt": "Tom " * 100_000})  # 400 kB: far past 768 tokens
        assert "characters, at least" in _is_openai_error(r, 400)["message"]
        assert watched.calls == [False, False]  # refused without tokenizing


def test_the_published_schema_says_what_the_server_answers(client):
    spec = client.get("/openapi.json").json()
    for path in ("/v1/chat/completions", "/v1/completions"):
        op = spec["paths"][path]["post"]
        assert set(op["responses"]) == {"200", "400", "404", "413", "429", "500", "503"}
        assert set(op["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
        error = op["responses"]["400"]["content"]["application/json"]["schema"]
        assert error == {"$ref": "#/components/schemas/ErrorResponse"}
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    props = spec["components"]["schemas"]["CompletionRequest"]["properties"]
    assert props["n"]["anyOf"] and props["n"]["enum"] == [1, None]


def test_last_error_expires(tokenizer):
    import time

    from fastapi.testclient import TestClient

    from serve.fake_engine import FakeEngine
    from serve.helpers import EOS, SCRIPT

    app, _ = make_app(tokenizer, FakeEngine(SCRIPT, eos=EOS, poison=130), error_ttl_s=30.0)
    with TestClient(app) as c:
        assert c.post("/v1/completions", json={"prompt": [130]}).status_code == 500
        assert c.get("/health").json()["last_error"] == "RuntimeError: poisoned batch"
        driver = app.state.driver
        driver.last_error_at = time.monotonic() - 31.0  # the TTL passed (no sleep: a loaded box's delays don't count)
        assert c.get("/health").json()["last_error"] is None
