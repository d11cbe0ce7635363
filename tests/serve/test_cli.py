"""``rstitch serve`` flags: listed in --help, validated with messages (no model is loaded)."""

from __future__ import annotations

import pytest

from hf_rstitch.cli.main import build_parser, main


def test_help_lists_the_issue_flags():
    sub = build_parser()._subparsers._group_actions[0].choices["serve"]
    flags = {o for a in sub._actions for o in a.option_strings}
    assert {"--llm", "--slm", "--threshold", "--router", "--host", "--port", "--device", "--max-batch",
            "--max-queue", "--replicas", "--schedule", "--prefill-chunk", "--join-wait", "--join-group", "--virtual-joins"} <= flags


@pytest.mark.parametrize("argv, needle", [
    (["--max-batch", "0"], "--max-batch must be >= 1, got 0"),
    (["--threshold", "2"], "`--threshold` must be a finite number in [0, 1]"),
    (["--llm", "some/folder"], "pass both --llm and --slm, or neither"),
    (["--port", "70000"], "--port must be in [0, 65535], got 70000"),
    (["--schedule", "later"], "--schedule: schedule 'later': use 'now', 'gather'"),
    (["--prefill-chunk", "-1"], "--prefill-chunk must be >= 0 tokens (0: joins prefill whole), got -1"),
    (["--join-wait", "-2"], "join_wait (--join-wait) must be an integer >= 0, got -2"),
    (["--join-group", "0"], "join_group (--join-group) must be an integer >= 1, got 0"),
    (["--virtual-joins", "-1"], "--virtual-joins must be an integer >= 0 (spare rows for joining prompts; 0: off)"),
])
def test_bad_flags_exit_2_with_a_message(argv, needle, capsys):
    assert main(["serve", *argv]) == 2
    assert needle in capsys.readouterr().err


def test_serve_help_and_package_import_load_no_torch_and_no_web_stack():
    import subprocess
    import sys
    from pathlib import Path

    code = ("import contextlib, io, sys\nfrom hf_rstitch.cli.main import main\nimport hf_rstitch.serve\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main(['serve', '--help'])\n    except SystemExit:\n        pass\n"
            "print(' '.join(m for m in ('torch', 'transformers', 'fastapi', 'uvicorn', 'ray') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []


def test_the_schedule_reaches_the_request_engine():
    from hf_rstitch import Role
    from hf_rstitch.core.scheduling import GatherForLLM
    from hf_rstitch.serve.config import ServeConfig, build_engine
    from tiny_models import make_pair

    llm, slm = make_pair("llama")
    assert build_engine(ServeConfig(schedule="gather:3:4"), llm, slm).schedule == GatherForLLM(3, 4)
    assert build_engine(ServeConfig(), llm, slm).schedule is None
    assert type(build_engine(ServeConfig(engine="auto"), llm, slm).lanes[Role.LLM]).__name__ == "Lane"  # CPU: eager


def test_the_split_by_default_for_one_server_on_cuda_one_process_elsewhere():
    from hf_rstitch.serve.config import ServeConfig

    assert ServeConfig().frontend_procs == 0  # CPU: measured, the split decodes no faster (docs/serving.md)
    assert ServeConfig(device="cuda").frontend_procs == 1 and ServeConfig(device="cuda:1").frontend_procs == 1
    assert ServeConfig(device="cuda", replicas=2).frontend_procs == 0  # replicas: the split not measured there
    assert ServeConfig(device="cuda", ray_address="auto").frontend_procs == 0  # a Ray replica, even one
    assert ServeConfig(device="cuda", frontend_procs=0).frontend_procs == 0
    assert ServeConfig(device="cuda", frontend_procs=1).frontend_procs == 1
    assert ServeConfig(frontend_procs=3).frontend_procs == 3
    assert ServeConfig(device="cuda", replicas=2, frontend_procs=1).frontend_procs == 1  # each replica's engine apart
    with pytest.raises(ValueError, match="pass --frontend-procs 1 .* or 0, got 2"):
        ServeConfig(frontend_procs=2, replicas=2)
