"""A practitioner's first hour: the CLI and example scripts as a user runs them (``python -m hf_rstitch``,
``python examples/...``), checked for clear one-line errors and results on stdout only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str, cwd: Path = ROOT, env: dict | None = None, script: str | None = None):
    """``python -m hf_rstitch ARGV`` (or ``python SCRIPT ARGV``) offline, as a user runs it."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, script, *argv] if script else [sys.executable, "-m", "hf_rstitch", *argv]
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=300)


def one_line_error(done, *needles: str) -> str:
    """The command failed with a single message line on stderr that holds every needle, and no traceback."""
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip() and "CPU thread" not in line]
    assert len(lines) == 1, done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_export_refuses_the_shipped_slm_it_cannot_carry(tmp_path):
    done = run("export-hub-template", str(tmp_path / "repo"), "--slm", "shipped:slm", "--threshold", "0.02")
    one_line_error(done, "--slm shipped:slm", "hf upload")
    assert not (tmp_path / "repo" / "custom_generate" / "generate.py").exists()


def _bench(tmp_path: Path) -> Path:
    data = tmp_path / "dev.jsonl"
    data.write_text(json.dumps({"id": "a", "problem": "What is 2 + 3?", "answer": "5"}) + "\n")
    return data


@pytest.mark.parametrize("argv", [
    pytest.param(["eval", "--llm", "org/missing-model", "--slm", "shipped:slm", "--data", "DATA", "--out", "OUT"], marks=pytest.mark.slow),
    ["tune", "--llm", "shipped:llm", "--slm", "org/missing-model", "--data", "DATA", "--max-drop", "1"],
    pytest.param(["generate", "--llm", "org/missing-model", "--slm", "shipped:slm"], marks=pytest.mark.slow),
    ["profile", "--model", "org/missing-model"],
    pytest.param(["train-router", "--llm", "org/missing-model", "--slm", "shipped:slm", "--steps", "1"], marks=pytest.mark.slow),
    ["export-hub-template", "OUT", "--llm", "org/missing-model"],
])
def test_a_hub_id_that_cannot_load_is_one_line_at_once(tmp_path, argv):
    """Offline (HF_HUB_OFFLINE=1) and a made-up id: the same path as a missing model or an unreachable Hub."""
    argv = [str(_bench(tmp_path)) if a == "DATA" else str(tmp_path / "out") if a == "OUT" else a for a in argv]
    done = run(*argv)
    one_line_error(done, "org/missing-model", "HF_HUB_OFFLINE")
    assert done.returncode == 2


@pytest.mark.slow
def test_unreadable_benchmark_files_are_one_line(tmp_path):
    binary = tmp_path / "dev.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage\n")
    folder = tmp_path / "folder.jsonl"
    folder.mkdir()
    for data in (binary, folder, tmp_path / "missing.jsonl"):
        done = run("eval", "--llm", "shipped:llm", "--slm", "shipped:slm", "--data", str(data),
                   "--out", str(tmp_path / "out"), "--methods", "llm")
        one_line_error(done, str(data))
        done = run("tune", "--llm", "shipped:llm", "--slm", "shipped:slm", "--data", str(data), "--max-drop", "1")
        one_line_error(done, str(data))
