"""A request the engine's KV memory could not hold (Event.error_code KV_FULL) is a 503 with Retry-After in OpenAI's
error shape, and in a stream an error event with that code, then [DONE] (hf_rstitch.batching.scheduler)."""

from __future__ import annotations

from hf_rstitch.batching.request_types import KV_FULL, Event
from serve.fake_engine import FakeEngine
from serve.helpers import EOS, SCRIPT, make_app, sse_events


class KVFullEngine(FakeEngine):
    """Ends every row it admits with the error the request engine gives a row that outgrew the KV pool."""

    def _next(self, rid, req, toks, roles):
        with self._lock:
            self._rows.pop(rid, None)
        return Event(rid, None, None, True, "error", error="the request holds 70 tokens, more than the KV memory's 64",
                     error_code=KV_FULL)


def test_kv_full_is_a_503_with_retry_after_and_a_coded_stream_error(tokenizer):
    from fastapi.testclient import TestClient

    app, _ = make_app(tokenizer, KVFullEngine(SCRIPT, eos=EOS))
    with TestClient(app) as c:
        r = c.post("/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 4})
        assert r.status_code == 503 and r.headers["Retry-After"] == "5"
        err = r.json()["error"]
        assert err["code"] == KV_FULL and err["type"] == "server_overloaded" and "KV memory" in err["message"]
        with c.stream("POST", "/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 4, "stream": True}) as s:
            events = sse_events(s.iter_lines())
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == KV_FULL
