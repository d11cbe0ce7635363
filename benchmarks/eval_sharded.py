"""Run ``rstitch eval`` as N parallel processes (one shard of the problems each), then merge.

Each shard writes its own folder OUT/shards/i; the records are concatenated into OUT/records.jsonl
and the report (tables, JSON summary, plots) is rebuilt from them with ``--report-only``. Every
sample is still decoded at batch size 1; the shards only share the machine. Latencies measured this
way include whatever the shards cost each other; compare methods within one run.

    python benchmarks/eval_sharded.py --shards 8 --threads 1 --out benchmarks/results/eval_toyworld_cpu_600_v3 -- \
        --llm hf_rstitch/assets/pair/llm --slm hf_rstitch/assets/pair/slm \
        --data hf_rstitch/assets/pair/test.jsonl --instruction "" --device cpu --max-new-tokens 400

``--resume-from DIR`` starts each shard from the records of an earlier run of the same command
(DIR/records.jsonl and DIR/run.json, e.g. a committed partial result): each record goes to the
shard that owns its problem, so only the missing (method, problem) pairs run. Compare latencies
across such a join only when both runs used the same kind of machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def seed_shards(prior: Path, shards: Path, n: int, eval_argv: list[str]) -> None:
    """Give shard i the records of ``prior`` whose problems shard i runs (``EvalConfig.shard_of``:
    problem k of the data, in order, belongs to shard k % n). Shards that already hold records are
    left alone (a warm resume of this run)."""
    from hf_rstitch.cli.args import dataclass_from_args
    from hf_rstitch.cli.eval import add_arguments
    from hf_rstitch.eval.config import EvalConfig
    from hf_rstitch.eval.data import load_problems

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = dataclass_from_args(EvalConfig, parser.parse_args([*eval_argv, "--out", str(shards)]))
    order = {(p.dataset, p.id): k for k, p in enumerate(p for src in cfg.data for p in load_problems(src, limit=cfg.limit))}
    buckets: dict[int, list[str]] = {i: [] for i in range(n)}
    skipped = 0
    for line in (prior / "records.jsonl").read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        k = order.get((record["dataset"], record["id"]))
        if k is None:
            skipped += 1
            continue
        buckets[k % n].append(line)
    for i, lines in buckets.items():
        folder = shards / str(i)
        if (folder / "records.jsonl").exists():
            continue
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "records.jsonl").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
        shutil.copy(prior / "run.json", folder / "run.json")
    print(f"seeded {n} shards with {sum(map(len, buckets.values()))} records of {prior}"
          + (f" ({skipped} of problems not in --data skipped)" if skipped else ""), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, theirs = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=4, help="parallel processes")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads per process (OMP_NUM_THREADS)")
    ap.add_argument("--out", required=True, help="merged output folder")
    ap.add_argument("--no-report", action="store_true", help="only merge the records (report later with --report-only)")
    ap.add_argument("--resume-from", help="folder of an earlier run of the same command (records.jsonl, run.json)")
    args = ap.parse_args(ours)
    out = Path(args.out)
    (out / "shards").mkdir(parents=True, exist_ok=True)
    if args.resume_from:
        seed_shards(Path(args.resume_from), out / "shards", args.shards, theirs)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    procs = []
    t0 = time.time()
    for i in range(args.shards):
        log = open(out / "shards" / f"{i}.log", "w")
        cmd = [sys.executable, "-m", "hf_rstitch.cli.main", "eval", *theirs, "--shard", f"{i}/{args.shards}",
               "--out", str(out / "shards" / str(i)), "--no-progress", "--no-plots"]
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log))
    failed = [i for i, (p, log) in enumerate(procs) if p.wait() != 0]
    print(f"{args.shards} shards finished in {time.time() - t0:.0f}s", file=sys.stderr)
    if failed:
        for i in failed:
            print((out / "shards" / f"{i}.log").read_text()[-3000:], file=sys.stderr)
        return 1
    with open(out / "records.jsonl", "w") as merged:
        for i in range(args.shards):
            merged.write((out / "shards" / str(i) / "records.jsonl").read_text())
    shutil.copy(out / "shards" / "0" / "run.json", out / "run.json")
    meta = json.loads((out / "run.json").read_text())
    meta["sharding"] = {"shards": args.shards, "threads_per_shard": args.threads, "wall_s": round(time.time() - t0, 1)}
    (out / "run.json").write_text(json.dumps(meta, indent=2) + "\n")
    if args.no_report:
        return 0
    return subprocess.call([sys.executable, "-m", "hf_rstitch.cli.main", "eval", "--report-only", "--out", str(out)])


if __name__ == "__main__":
    sys.exit(main())
