"""Two CPU replicas on Ray Serve, on loopback: requests spread over both, answers (plain and
streamed) equal solo generate, and stopping drains a running stream."""

from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from hf_rstitch.toyworld.pair import assets_present
from serve.helpers import sse_events
from serve.pair_cases import CASES, body, got, solo

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not assets_present(), reason="shipped toy-world pair absent")]
ROOT = Path(__file__).resolve().parents[2]


def _stream(url: str, request: dict, started: threading.Event, out: list) -> None:
    lines = []
    with httpx.stream("POST", url + "/v1/chat/completions", json={**request, "stream": True}, timeout=120) as r:
        for line in r.iter_lines():
            lines.append(line)
            if len(lines) == 4:
                started.set()
    out.extend(sse_events(lines))


def test_two_cpu_replicas_on_ray_serve(one_thread):
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install 'hf-rstitch[serve-ray]'")
    from hf_rstitch.serve import replicas
    from hf_rstitch.serve.config import ServeConfig

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = ServeConfig(port=port, replicas=2, cpus_per_replica=0.5, max_batch=4, max_queue=8)
    ray_init = dict(num_cpus=2, object_store_memory=100 * 1024**2, log_to_driver=False,
                    runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
                                              "OMP_NUM_THREADS": "1"}})
    url = f"http://127.0.0.1:{port}"
    started, drained, long = threading.Event(), [], None
    try:
        replicas.start(cfg, ray_init)
        pids = {httpx.get(url + "/health", timeout=30).json()["pid"] for _ in range(30)}
        with ThreadPoolExecutor(len(CASES)) as pool:
            answers = list(pool.map(
                lambda c: httpx.post(url + "/v1/chat/completions", json=body(*c), timeout=120), CASES))
        streamed = []
        _stream(url, body(*CASES[0]), threading.Event(), streamed)
        # tau 0: the LLM writes every token, long enough to be running when the replicas stop
        long = threading.Thread(target=_stream, args=(url, body(1, 0.0, 400), started, drained))
        long.start()
        assert started.wait(60)
    finally:
        replicas.stop()
    long.join(60)
    assert len(pids) == 2, pids
    assert [r.status_code for r in answers] == [200] * len(CASES)
    for case, r in zip(CASES, answers):
        assert got(r.json()) == solo(*case), case
    assert streamed[-1] == "[DONE]"  # streams pass through Ray's proxy
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in streamed[:-1]) == solo(*CASES[0])["text"]
    assert drained[-1] == "[DONE]" and drained[-2]["choices"][0]["finish_reason"] in ("stop", "length")
