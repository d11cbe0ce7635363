"""Two CPU replicas on Ray Serve, on loopback: requests spread over both, answers (plain and
streamed) equal solo generate."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from hf_rstitch.toyworld.pair import assets_present
from serve.helpers import sse_events
from serve.pair_cases import CASES, body, got, solo

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not assets_present(), reason="shipped toy-world pair absent")]
ROOT = Path(__file__).resolve().parents[2]


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
    try:
        replicas.start(cfg, ray_init)
        url = f"http://127.0.0.1:{port}"
        pids = {httpx.get(url + "/health", timeout=30).json()["pid"] for _ in range(30)}
        with ThreadPoolExecutor(len(CASES)) as pool:
            answers = list(pool.map(
                lambda c: httpx.post(url + "/v1/chat/completions", json=body(*c), timeout=120), CASES))
        with httpx.stream("POST", url + "/v1/chat/completions", json=body(*CASES[0], stream=True), timeout=120) as r:
            chunks = sse_events(r.iter_lines())
    finally:
        replicas.stop()
    assert len(pids) == 2, pids
    assert [r.status_code for r in answers] == [200] * len(CASES)
    for case, r in zip(CASES, answers):
        assert got(r.json()) == solo(*case), case
    assert chunks[-1] == "[DONE]"  # streams pass through Ray's proxy
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]) == solo(*CASES[0])["text"]
