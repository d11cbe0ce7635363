"""The garbage collector's pauses inside a serving engine's steps, with and without ``freeze_gc`` (serve/driver.py).

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD:$PWD/benchmarks python benchmarks/gc_pauses.py --out-dir benchmarks/results
    PYTHONPATH=$PWD:$PWD/benchmarks python benchmarks/gc_pauses.py --device cuda --pair qwen2 --out-dir $OUT  # GPU

Each variant runs in a fresh process (what has been collected or frozen before does not carry over): the pair
(``tiny`` on the CPU, or random Qwen2 7B / 1.5B on a GPU), its request engine warmed up as ``serve_reasoning.py``
does, then ``serve_alone``'s closed loop of the engine alone for ``--seconds`` at ``--clients``. ``frozen``: as the
server does once built (the loop itself freezes: :func:`serve_alone.engine_closed_loop`); ``plain``: the same with the
freeze undone (``gc.unfreeze()`` right after it), so every collection walks the start-up objects. Per variant and
collector generation, from the loop's first step to the end of its window (the freeze's own collection and the drain
after are not the loop's steps): collections, mean
and largest pause (``gc.callbacks``), with the objects tracked, steps a second and tokens a second (the loop undoes its freeze when it ends). Writes ``gc_pauses_<device>.{json,md}``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lab  # noqa: E402

VARIANTS = ("plain", "frozen")


def child(args) -> dict:
    """One variant in this process: the loop's collections by generation."""
    import serve_alone
    import serve_reasoning as sr

    shape = sr.shapes(args.scale)
    dtype = "float32" if args.device == "cpu" else "bfloat16"
    cfg = sr.alone_cfg(args.method, shape, args.pair, args.device, dtype, "default" if args.device == "cpu" else "auto",
                       args.clients)
    engine = sr.build_engine(cfg, *sr.build_pair(cfg))
    sr.warm(engine, cfg)
    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    started = {}

    def on_gc(phase, info):  # a collection inside the loop's warm-up and window (not its drain after)
        if phase == "start":
            started["t"] = time.perf_counter()
        elif "t" in started and started["t"] < tracked["until"]:
            pauses[info["generation"]].append(time.perf_counter() - started.pop("t"))

    tracked = {}

    def undo_freeze(_elapsed):  # the loop froze on entry (its own full collection not counted: the probe starts
        if not tracked:          # now); "plain" undoes the freeze before its first step
            if args.variant == "plain":
                gc.unfreeze()
            tracked.update(objects=len(gc.get_objects()), frozen=gc.get_freeze_count(),
                           until=time.perf_counter() + 1.0 + args.seconds)  # the loop's warm-up and window
            gc.callbacks.append(on_gc)
    ps = sr.prompts(len(shape[args.method]), shape["prompt"])
    loop = serve_alone.engine_closed_loop(engine, cfg, ps, args.clients, 1.0, args.seconds, on_step=undo_freeze)
    gc.callbacks.remove(on_gc)
    return {"variant": args.variant, "tracked": tracked["objects"], "frozen": tracked["frozen"],
            "steps_per_s": loop["steps_per_s"], "tokens_per_s": loop["tokens_per_s"], "p99_s": loop["p99_s"],
            "generations": {g: {"collections": len(p), "mean_ms": 1e3 * sum(p) / len(p) if p else 0.0,
                                "max_ms": 1e3 * max(p, default=0.0), "total_s": sum(p)} for g, p in pauses.items()}}


def markdown(doc: dict) -> str:
    lines = [f"# The garbage collector's pauses in a serving engine's steps: {doc['device_name']}", "",
             f"{doc['pair']} pair, {doc['method']}, the engine alone's closed loop at {doc['clients']} clients for "
             f"{doc['seconds']} s (`serve_alone.engine_closed_loop`); `frozen`: the start-up objects frozen as "
             "`rstitch serve` does once built (`serve/driver.py:freeze_gc`), `plain`: not. Pauses from `gc.callbacks`.",
             "", "| variant | objects tracked | frozen | generation | collections | mean pause ms | largest ms | "
             "total s | steps/s | tokens/s | p99 s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        for g, p in r["generations"].items():
            lines.append(f"| {r['variant']} | {r['tracked']:,} | {r['frozen']:,} | {g} | {p['collections']} | "
                         f"{p['mean_ms']:.2f} | {p['max_ms']:.2f} | {p['total_s']:.2f} | {r['steps_per_s']:.1f} | "
                         f"{r['tokens_per_s']:.0f} | {r['p99_s']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--pair", default="tiny", choices=["tiny", "qwen2"])
    ap.add_argument("--method", default="llm_only", choices=["llm_only", "stitched"])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--scale", type=float, default=0.05)
    ap.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # a child's variant
    args = ap.parse_args(argv)
    if args.variant:
        print(lab.CHILD_RESULT + json.dumps(child(args)), flush=True)
        return 0
    rows = []
    for variant in VARIANTS:
        cmd = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--variant", variant]
        row = lab.run_child(cmd, dict(os.environ), timeout=600)
        if "error" in row:
            raise SystemExit(f"gc_pauses.py: the {variant} run failed: {row['error']}")
        rows.append(row)
        print(f"[{variant}] {json.dumps(row)}", file=sys.stderr, flush=True)
    doc = {**lab.environment([args.device]), "device_name": lab.device_name(args.device), "pair": args.pair,
           "method": args.method, "clients": args.clients, "seconds": args.seconds, "rows": rows}
    stem = Path(args.out_dir) / f"gc_pauses_{lab.file_tag(args.device)}"
    lab.write_result(stem, doc, markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
