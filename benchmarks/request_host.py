"""The request engine's host work a step at 256 rows, this tree against another revision, on the CPU.

    git worktree add /tmp/before <rev>
    PYTHONPATH=$PWD:$PWD/benchmarks python benchmarks/request_host.py --against /tmp/before --pairs 8

Each run is :func:`host_standin.request_host_ms` in a fresh process (the fast lanes' path with every model call
stubbed, 256 requests of ``serve_reasoning.py``'s shapes in a closed loop, CPU time a step over 300 steps after
100): what the host does a step for that many rows, which on a GPU is the device's idle time wherever it is not
overlapped (the serving phase table's ``other``). Runs of the two trees alternate, ``--pairs`` times a method, so
that a shared machine's slow minutes fall on both alike; the table gives each tree's median and minimum, the JSON
every run. Writes ``request_host_cpu.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
METHODS = ("llm_only", "stitched")


def one_run(tree: Path, method: str) -> float:
    """CPU ms a step of one run with ``tree``'s hf_rstitch (this tree's benchmarks), in a fresh process."""
    code = ("import torch; torch.set_num_threads(1)\nfrom host_standin import request_host_ms\n"
            f"print('RESULT', request_host_ms({method!r}))")
    env = {**os.environ, "PYTHONPATH": f"{tree}:{HERE}", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    return float(next(line.split()[1] for line in out.splitlines() if line.startswith("RESULT ")))


def revision(tree: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return str(tree)


def markdown(doc: dict) -> str:
    lines = ["# The request engine's host work a step at 256 rows (CPU, model calls stubbed)", "",
             f"{doc['devices'][0]}, torch {doc['torch']}, {doc['date']}. CPU ms a step, 256 requests in a closed loop "
             "on the fast lanes' path (their CPU eager steps) with every model call stubbed; runs of the two trees "
             f"alternate, {doc['pairs']} a tree and method, each in a fresh process.", "",
             "| method | tree | median ms | min ms | median vs before |", "|---|---|---|---|---|"]
    for method in doc["methods"]:
        before = doc["runs"][method]["before"]
        for name in ("before", "after"):
            runs = doc["runs"][method][name]
            vs = f"{statistics.median(runs) / statistics.median(before) - 1:+.0%}" if name == "after" else "-"
            lines.append(f"| {method} | {name} ({doc['trees'][name]}) | {statistics.median(runs):.2f} | "
                         f"{min(runs):.2f} | {vs} |")
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for k, method in enumerate(doc["methods"]):
        for j, name in enumerate(("before", "after")):
            runs = doc["runs"][method][name]
            x = 3 * k + j
            ax.scatter([x] * len(runs), runs, alpha=0.6, color=f"C{j}", label=f"{name} ({doc['trees'][name]})"
                       if k == 0 else None)
            ax.hlines(statistics.median(runs), x - 0.3, x + 0.3, color=f"C{j}")
    ax.set_xticks([0.5 + 3 * k for k in range(len(doc["methods"]))], doc["methods"])
    ax.set(ylabel="host CPU ms a step, 256 rows", ylim=(0, None),
           title="Request engine host work a step (runs; line: median)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, type=Path, help="a checkout of the revision to compare with")
    ap.add_argument("--pairs", type=int, default=8, help="runs a tree and method (alternating)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--out-dir", type=Path, default=HERE / "results")
    args = ap.parse_args(argv)
    if not (args.against / "hf_rstitch").is_dir():
        ap.error(f"--against {args.against}: no hf_rstitch package there (a checkout of the revision, e.g. made "
                 "with git worktree add)")
    sys.path.insert(0, str(HERE))
    import lab

    trees = {"before": args.against.resolve(), "after": HERE.parent}
    runs = {m: {"before": [], "after": []} for m in args.methods}
    for method in args.methods:
        for i in range(args.pairs):
            for name, tree in trees.items():
                runs[method][name].append(round(one_run(tree, method), 3))
            print(f"{method} pair {i + 1}: {runs[method]['before'][-1]} / {runs[method]['after'][-1]} ms",
                  file=sys.stderr, flush=True)
    doc = {**lab.environment(["cpu"]), "pairs": args.pairs, "methods": args.methods,
           "trees": {k: revision(v) for k, v in trees.items()}, "runs": runs}
    stem = args.out_dir / "request_host_cpu"
    lab.write_result(stem, doc, markdown(doc))
    plot(doc, stem.with_suffix(".png"))
    print(markdown(doc))
    print(json.dumps({m: {k: statistics.median(v) for k, v in r.items()} for m, r in runs.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
