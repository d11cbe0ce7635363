"""CPU threads for tiny models (hf_rstitch.threads): one thread unless the user chose, said on stderr."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_rstitch import shipped
from hf_rstitch.threads import TINY_PARAMS, choose_threads, count_params

ROOT = Path(__file__).resolve().parents[2]


def test_parameter_counts_come_from_the_weight_files():
    assert 9_000_000 < count_params(shipped("llm")) < 10_500_000
    assert 800_000 < count_params(shipped("slm")) < 1_000_000
    assert count_params("org/no-such-model-in-any-cache") is None


@pytest.mark.parametrize("params, requested, env, threads", [
    ([9_700_000, 900_000], None, {}, 1),  # tiny, nothing chosen: one thread
    ([9_700_000, 900_000], None, {"OMP_NUM_THREADS": "2"}, None),  # the user's environment wins
    ([9_700_000, 900_000], 3, {"OMP_NUM_THREADS": "2"}, 3),  # --threads wins over everything
    ([TINY_PARAMS, 900_000], None, {}, None),  # large models keep torch's default
    ([None, 900_000], None, {}, None),  # unknown size: keep torch's default
])
def test_choice(params, requested, env, threads):
    assert choose_threads(params, requested, env)[0] == threads


def _rstitch(*argv, env_update=None):
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update({"HF_HUB_OFFLINE": "1", **(env_update or {})})
    return subprocess.run([sys.executable, "-m", "hf_rstitch", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_cli_on_the_shipped_pair_uses_one_thread_and_says_so():
    done = _rstitch("generate", "--max-new-tokens", "2", "--no-colour")
    assert done.returncode == 0, done.stderr
    assert "torch uses 1 CPU thread" in done.stderr and "OMP_NUM_THREADS" in done.stderr
    assert "CPU thread" not in done.stdout  # stdout is for results
    done = _rstitch("generate", "--max-new-tokens", "2", "--no-colour", env_update={"OMP_NUM_THREADS": "2"})
    assert done.returncode == 0 and "CPU thread" not in done.stderr


def test_threads_flag_is_on_every_command_and_documented():
    done = _rstitch("demo", "--help")
    assert "--threads" in done.stdout and "OMP_NUM_THREADS" in done.stdout
    done = _rstitch("eval", "--threads", "0")
    assert done.returncode == 2 and "positive" in done.stderr


def test_cli_sets_the_count_in_process(monkeypatch):
    import torch

    from hf_rstitch.cli.main import _choose_threads, build_parser

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        _choose_threads(build_parser().parse_args(["demo"]))
        assert torch.get_num_threads() == 1
        _choose_threads(build_parser().parse_args(["eval", "--threads", "2", "--llm", "org/x", "--slm", "org/y"]))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
