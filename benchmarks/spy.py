"""Where a server's processes hold the GIL during a window: py-spy (``pip install py-spy``) sampled on the server
process and its children (the split layout's engine process), only while a thread holds the GIL (``--gil``).

:func:`start` begins a recording after a delay (a closed loop's warm-up); :func:`summary` reads the raw output as
each process's threads' shares of the samples taken while that process held the GIL, with each thread's top
functions. serve_reasoning.py ``--spy`` records each server level's window this way. The question it answers: on
a step that the device should set the pace of, does another thread in the engine's process take the GIL from the
thread that steps the engine (the split layout's link threads: a message a step to the front end)?
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

RATE = 250  # samples a second


def available() -> bool:
    return shutil.which("py-spy") is not None


def start(pid: int, delay_s: float, seconds: float, out: Path) -> subprocess.Popen:
    """Record ``pid`` and its children for ``seconds`` from ``delay_s`` from now, raw stacks to ``out`` (py-spy's
    messages to ``out`` + ``.err``: a machine that forbids tracing says so there)."""
    cmd = (f"sleep {max(0.0, delay_s):.2f} && exec py-spy record -p {pid} --subprocesses --threads --gil "
           f"--nonblocking -r {RATE} -d {max(1, round(seconds))} --format raw -o {out}")
    err = Path(f"{out}.err").open("w")
    return subprocess.Popen(["bash", "-c", cmd], stdout=err, stderr=subprocess.STDOUT)


def summary(path: Path, top: int = 4) -> dict:
    """``{process: {"samples": n, "threads": {thread: {"share": s, "top": [[function, share], ...]}}}}`` from
    py-spy's raw output (``frames;...;frames count`` lines; leading ``process ...`` frames name the process, the
    next the thread). Processes are keyed by their command's last words (their pid varies)."""
    counts: dict[str, Counter] = defaultdict(Counter)
    leaves: dict[tuple[str, str], Counter] = defaultdict(Counter)
    if not path.exists():
        err = Path(f"{path}.err")
        said = err.read_text().strip().splitlines()[-3:] if err.exists() else []
        return {"no recording": {"samples": 0, "threads": {}, "error": " | ".join(said) or "py-spy wrote nothing"}}
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = stack.split(";")
        procs = [f for f in frames if f.startswith("process ")]
        threads = [f for f in frames if f.startswith("thread (")]
        if not procs or not threads:
            continue
        proc = _process_name(procs)
        thread = threads[0].split(": ", 1)[-1]
        counts[proc][thread] += int(n)
        leaves[(proc, thread)][frames[-1].split(" (")[0]] += int(n)
    out = {}
    for proc, threads in counts.items():
        total = sum(threads.values())
        out[proc] = {"samples": total, "threads": {
            t: {"share": n / total, "top": [[f, m / n] for f, m in leaves[(proc, t)].most_common(top)]}
            for t, n in threads.most_common()}}
    return out


def _process_name(procs: list[str]) -> str:
    """A sample's process frames (``process 123:"command"``, the recorded process first, then each child down to
    the one sampled) -> a short stable name: "server" (the process recorded), "spawned child" (a child made by
    multiprocessing's spawn: the split layout's engine process), else the child's command's first 40 characters."""
    if len(procs) == 1:
        return "server"
    cmd = procs[-1].split(":", 1)[-1].strip('"')
    if "multiprocessing.spawn" in cmd and len(procs) == 2:
        return "spawned child"
    return f"child: {cmd[:40]}"


def lines(spy: dict) -> list[str]:
    """One line per process: its threads' shares of the GIL-held samples, the top functions of the others than
    the busiest."""
    out = []
    for proc, d in spy.items():
        if d.get("error"):
            out.append(f"{proc}: {d['error']}")
            continue
        parts = [f"{t} {v['share']:.0%}" for t, v in d["threads"].items() if v["share"] >= 0.005]
        out.append(f"{proc} ({d['samples']} samples): " + ", ".join(parts))
    return out
