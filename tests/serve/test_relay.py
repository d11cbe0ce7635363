"""The replicas' relay without Ray (hf_rstitch.serve.relay): a replica's app called in-process answers as over
HTTP, and the front app turns a replica lost before or during its answer into a clean OpenAI error."""

from __future__ import annotations

import asyncio
import json

import pytest

from serve.helpers import CHAT, SCRIPT_TEXT, make_app, sse_events


@pytest.fixture
def replica(tokenizer):
    """A replica's app (the fake engine), its driver started as under uvicorn."""
    app, _ = make_app(tokenizer)
    app.state.driver.start()
    yield app
    app.state.driver.drain(1.0)


def front(forward):
    from fastapi.testclient import TestClient

    from hf_rstitch.serve.relay import front_app

    return TestClient(front_app(forward))


def through(replica):
    from hf_rstitch.serve.relay import call_app

    return lambda head, body: call_app(replica, head, body)


def test_relayed_answers_equal_the_app_s_own(replica):
    from fastapi.testclient import TestClient

    direct, relayed = TestClient(replica), front(through(replica))
    for path, body in (("/v1/chat/completions", {**CHAT, "max_tokens": 5}), ("/v1/completions", {"prompt": "Tom"}),
                       ("/v1/completions", {"prompt": "Tom", "max_tokens": 0})):  # the last: a 400
        want, got = direct.post(path, json=body), relayed.post(path, json=body)
        assert got.status_code == want.status_code and got.headers["content-type"] == want.headers["content-type"]
        strip = lambda b: {k: v for k, v in b.items() if k not in ("id", "created")}  # noqa: E731
        assert strip(got.json()) == strip(want.json())
    with relayed.stream("POST", "/v1/completions", json={"prompt": "Tom", "stream": True}) as r:
        events = sse_events(r.iter_lines())
    assert r.status_code == 200 and events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == SCRIPT_TEXT
    assert relayed.get("/health").json()["status"] == "ok" and relayed.get("/nope").status_code == 404


def test_replica_lost_before_its_answer_is_a_503_openai_error():
    async def dead(head, body):
        raise RuntimeError("ActorDiedError: the actor died unexpectedly")
        yield  # noqa: unreachable -- an async generator

    r = front(dead).post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and "replica" in err["message"]
    assert "ActorDiedError" in err["message"]


def test_replica_lost_mid_stream_ends_it_with_an_error_event_and_done():
    chunk = {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": " So", "finish_reason": None}]}

    async def dies_after_two_events(head, body):
        yield {"status": 200, "headers": [("content-type", "text/event-stream; charset=utf-8")]}
        for _ in range(2):
            yield f"data: {json.dumps(chunk)}\n\n".encode()
            await asyncio.sleep(0)
        raise RuntimeError("ActorDiedError: the actor died unexpectedly")

    with front(dies_after_two_events).stream("POST", "/v1/completions", json={"prompt": "Tom", "stream": True}) as r:
        events = sse_events(r.iter_lines())
    assert r.status_code == 200 and events[:2] == [chunk, chunk] and events[-1] == "[DONE]" and len(events) == 4
    assert events[2]["error"]["code"] == "replica_lost" and "ActorDiedError" in events[2]["error"]["message"]


def test_no_replica_free_is_the_429_of_a_full_server_not_a_lost_replica():
    from hf_rstitch.serve.relay import AtCapacity

    async def full(head, body):
        raise AtCapacity("Request dropped due to backpressure (num_queued_requests=2, max_queued_requests=2).")
        yield  # noqa: unreachable -- an async generator

    r = front(full).post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "rate_limit_exceeded"
    assert "at capacity" in err["message"] and "stopped" not in err["message"]


def test_ray_s_backpressure_is_at_capacity_and_a_dead_replica_is_not():
    """The front replica's forward over Ray's handle: BackPressureError (every replica's queue full) becomes
    AtCapacity; any other failure (the replica's process died) passes through, to be answered as lost."""
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install 'hf-rstitch[serve-ray]'")
    from ray.serve.exceptions import BackPressureError

    from hf_rstitch.serve.relay import AtCapacity
    from hf_rstitch.serve.replicas import forward_to

    class Handle:  # Ray's streaming DeploymentHandle, as forward_to uses it: handle.forward.remote(head, body)
        def __init__(self, err):
            self.forward = self
            self.err = err

        async def remote(self, head, body):
            yield {"status": 200, "headers": []}
            raise self.err

    async def drain(forward):
        return [item async for item in forward({"method": "GET", "path": "/health"}, b"")]

    with pytest.raises(AtCapacity, match="backpressure"):
        asyncio.run(drain(forward_to(Handle(BackPressureError(num_queued_requests=2, max_queued_requests=2)))))
    with pytest.raises(RuntimeError, match="ActorDiedError"):
        asyncio.run(drain(forward_to(Handle(RuntimeError("ActorDiedError: the actor died")))))
