"""``rstitch eval`` under torchrun: each process evaluates its shard, rank 0 writes one merged report."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

PAIR = Path(__file__).resolve().parents[2] / "hf_rstitch" / "assets" / "pair"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _eval(out: Path, *launcher: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, *launcher, "-m", "hf_rstitch.cli.main", "eval", "--llm", str(PAIR / "llm"), "--slm",
           str(PAIR / "slm"), "--data", str(PAIR / "test.jsonl"), "--limit", "4", "--methods", "llm", "rstitch",
           "--thresholds", "0.005", "--max-new-tokens", "60", "--out", str(out), "--no-plots", "--device", "cpu",
           "--instruction", "", "--no-progress"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                                                                                  "MASTER_ADDR": "127.0.0.1"})


def _records(path: Path) -> dict:
    return {(r["id"], r["method"]): r for r in map(json.loads, path.read_text().splitlines())}


@pytest.mark.slow
def test_torchrun_shards_and_merges_into_one_report(tmp_path):
    one = _eval(tmp_path / "one")
    assert one.returncode == 0, one.stderr[-2000:]
    two = _eval(tmp_path / "two", "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                "--master_port", str(_free_port()))
    assert two.returncode == 0, two.stderr[-3000:]
    merged = _records(tmp_path / "two" / "records.jsonl")
    assert {k: r["output"] for k, r in merged.items()} == {k: r["output"] for k, r in _records(tmp_path / "one" / "records.jsonl").items()}
    assert len(merged) == 8 and len(_records(tmp_path / "two" / "rank1" / "records.jsonl")) == 4
    assert json.loads((tmp_path / "two" / "run.json").read_text())["world_size"] == 2
    assert two.stdout.count("report:") == 1  # only rank 0 prints the merged report
    assert "n=4" in (tmp_path / "two" / "report.md").read_text()
