"""Running the package as a user does: ``python -m hf_rstitch ARGV`` or ``python SCRIPT ARGV`` in a fresh process,
offline, with this checkout first on the path; and what a one-line error looks like."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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


PROBE = """import sys, time
if sys.argv[1] == "torch":
    import torch  # noqa: F401  (imported before the clock starts: its import is no part of what is timed)
from hf_rstitch.cli.main import main
start = time.perf_counter()
rc = main(sys.argv[2:])
print("PROBE", time.perf_counter() - start, *[m for m in ("torch", "transformers") if m in sys.modules])
sys.exit(rc)
"""


def run_probed(*argv: str, env: dict | None = None, preload_torch: bool = False):
    """``rstitch ARGV`` as :func:`run` does it, plus what it took: ``(done, seconds in the command, heavy modules
    imported)``; with ``preload_torch`` torch is imported before the clock starts."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    full_env = {k: v for k, v in full_env.items() if v is not None}
    full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = subprocess.run([sys.executable, "-c", PROBE, "torch" if preload_torch else "-", *argv], cwd=ROOT,
                          env=full_env, capture_output=True, text=True, timeout=300)
    probe = next(line for line in done.stdout.splitlines() if line.startswith("PROBE")).split()
    done.stdout = "\n".join(line for line in done.stdout.splitlines() if not line.startswith("PROBE"))
    return done, float(probe[1]), probe[2:]
