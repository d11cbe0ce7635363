"""Fuzzing the live server: schemathesis from the published /openapi.json (every check, continuing past
failures), and a hypothesis property over the shipped pair -- random valid and invalid bodies sent while
innocent greedy requests decode, every innocent answer equal to its solo ``generate``. Both count what they
sent and what came back (printed: cases, clear 4xx errors, 200s, 5xx); a 5xx fails the test."""

from __future__ import annotations

import collections
import json
import shutil
import subprocess
import threading

import httpx
import pytest

from hf_rstitch.toyworld.pair import assets_present
from serve.helpers import make_app, sse_events
from serve.live import LiveServer

pytestmark = pytest.mark.slow


class CountStatus:
    """ASGI middleware: how many responses of each status the app sent."""

    def __init__(self, app, counts: collections.Counter):
        self.app, self.counts = app, counts

    async def __call__(self, scope, receive, send):
        async def counted(message):
            if message["type"] == "http.response.start":
                self.counts[message["status"]] += 1
            await send(message)

        await self.app(scope, receive, counted)


def _report(name, counts):
    total = sum(counts.values())
    summary = {"fuzzer": name, "cases": total, "ok_2xx": sum(n for s, n in counts.items() if s < 300),
               "clear_4xx": sum(n for s, n in counts.items() if 400 <= s < 500),
               "5xx": sum(n for s, n in counts.items() if s >= 500), "by_status": dict(sorted(counts.items()))}
    print(json.dumps(summary))
    return summary


def test_schemathesis_finds_nothing(tokenizer, tmp_path):
    if shutil.which("st") is None:
        pytest.skip("schemathesis is not installed (pip install 'hf-rstitch[dev]')")
    app, _ = make_app(tokenizer)  # the scripted engine: thousands of cases in the time budget
    counts: collections.Counter = collections.Counter()
    app.add_middleware(CountStatus, counts=counts)
    with LiveServer(app) as srv:
        done = subprocess.run(
            # every check but positive_data_acceptance: a schema-valid body may still not fit the context window
            # (prompt + max_tokens > 768 tokens: a 400, as OpenAI answers), a bound on a sum no schema can state
            ["st", "run", srv.url + "/openapi.json", "--checks", "all", "--exclude-checks", "positive_data_acceptance",
             "--continue-on-failure", "--max-examples", "30",
             "--seed", "1", "--max-time", "90", "--workers", "1", "--no-color", "--generation-database", "none",
             "--output-sanitize", "false", "--request-timeout", "20"],
            capture_output=True, text=True, timeout=240, cwd=tmp_path)
    summary = _report("schemathesis", counts)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert summary["5xx"] == 0 and summary["cases"] > 100


# ---- hypothesis over the shipped pair ----------------------------------------------------------------
INNOCENTS = [(0, None, 24), (1, 0.001, 24), (2, 0.05, 16)]


def _bodies():
    """(path, body): a valid body (tiny and huge sampling values, stop strings, seeds past 2**64, empty prompts,
    token ids, streams) half the time, else one with a field replaced by junk or an unknown field added."""
    from hypothesis import strategies as st

    junk = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                     st.text(max_size=12), st.lists(st.integers(-5, 200), max_size=4), st.dictionaries(
                         st.text(max_size=3), st.integers(), max_size=2))
    text = st.one_of(st.text(max_size=40), st.sampled_from(["Tom has 3 apples.", "", "12 + 7 ="]))
    valid = {
        "max_tokens": st.integers(1, 6),  # the pair decodes on CPU: valid budgets stay small
        "temperature": st.sampled_from([0, 1e-45, 5e-324, 1e-300, 0.7, 2.0]),
        "top_p": st.sampled_from([5e-324, 1e-300, 0.5, 1.0]),
        "seed": st.integers(-2**80, 2**80),
        "stop": st.one_of(text, st.lists(st.text(min_size=1, max_size=3), max_size=4)),
        "stream": st.booleans(),
        "stitch_threshold": st.floats(0, 1),
        "n": st.just(1),
        "model": st.sampled_from(["rstitch-toyworld-pair", None]),
    }
    optional = {k: v for k, v in valid.items() if k != "max_tokens"}
    messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]),
                                               "content": text}), min_size=1, max_size=3)
    prompt = st.one_of(text, st.lists(st.integers(0, 130), min_size=1, max_size=8))
    chat = st.fixed_dictionaries({"messages": messages, "max_tokens": valid["max_tokens"]}, optional=optional)
    completion = st.fixed_dictionaries({"prompt": prompt, "max_tokens": valid["max_tokens"]}, optional=optional)
    fields = ["max_tokens", "messages", "prompt", "bogus_field", *optional]

    @st.composite
    def body(draw):
        path, data = draw(st.one_of(st.tuples(st.just("/v1/chat/completions"), chat),
                                    st.tuples(st.just("/v1/completions"), completion)))
        spoil = draw(st.sampled_from([None] * len(fields) + fields))
        if spoil is not None:
            data = {**data, spoil: draw(junk)}
        return path, data

    return body()


@pytest.mark.skipif(not assets_present(), reason="shipped toy-world pair absent")
def test_random_bodies_never_disturb_innocent_requests(one_thread):
    from hypothesis import HealthCheck, given, settings

    from hf_rstitch.serve.app import create_app
    from hf_rstitch.serve.config import ServeConfig, build_engine, settings_for
    from serve.pair_cases import SERVER_TAU, body, got, pair, solo

    llm, slm, tok = pair()
    cfg = ServeConfig(threshold=SERVER_TAU, max_batch=4, max_queue=16)
    engine = build_engine(cfg, llm, slm)
    app = create_app(engine, tok, settings_for(cfg, llm))
    counts: collections.Counter = collections.Counter()
    app.add_middleware(CountStatus, counts=counts)
    answers, stop = collections.defaultdict(list), threading.Event()

    def innocent(case):
        with httpx.Client(timeout=120) as c:
            while not stop.is_set():
                r = c.post(url + "/v1/chat/completions", json=body(*case))
                answers[case].append(got(r.json()) if r.status_code == 200 else r.text)

    @settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(_bodies())
    def fuzz(case):
        path, data = case
        raw = json.dumps(data)  # NaN-free: the strategies draw finite floats
        with httpx.Client(timeout=120) as c, c.stream("POST", url + path, content=raw,
                                                     headers={"content-type": "application/json"}) as r:
            payload = b"".join(r.iter_bytes())
        assert r.status_code in (200, 400, 404, 413, 429), (r.status_code, payload[:500])
        if r.status_code != 200:
            assert set(json.loads(payload)["error"]) == {"message", "type", "param", "code"}
        elif r.headers["content-type"].startswith("text/event-stream"):
            events = sse_events(payload.decode().splitlines())
            assert events[-1] == "[DONE]" and not any(isinstance(e, dict) and "error" in e for e in events)

    with LiveServer(app) as srv:
        url = srv.url
        workers = [threading.Thread(target=innocent, args=(case,)) for case in INNOCENTS]
        for w in workers:
            w.start()
        try:
            fuzz()
        finally:
            stop.set()
            for w in workers:
                w.join(120)
        engine.check_consistent()
        health = httpx.get(url + "/health").json()
    summary = _report("hypothesis", counts)
    innocent_total = sum(len(a) for a in answers.values())
    print(json.dumps({"innocent_answers": innocent_total}))
    for case in INNOCENTS:
        want = solo(*case)
        assert answers[case] and all(a == want for a in answers[case]), (case, answers[case][:2])
    assert summary["5xx"] == 0 and health["status"] == "ok" and health["last_error"] is None
