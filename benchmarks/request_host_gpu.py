"""The request engine's host work a step on a GPU machine, and where it goes (cProfile), under the serving load.

    PYTHONPATH=$PWD:$PWD/benchmarks python benchmarks/request_host_gpu.py --out-dir $OUT --levels 64 256

``serve_reasoning.py``'s closed loop of the engine alone (its MATH-shaped requests and replayed routes, decisions on
the device) on a *tiny* random pair on the GPU: the device's part of a step is then a few tenths of a millisecond,
so a step's wall time is the host's own work -- the real path's launches, copies and event waits included, which
the CPU stand-in (``request_host.py``) stubs out. At the 7B pair's step (its phase table) a host slower than this
leaves the device idle. Per method and level: ms a step plain, then the same loop under cProfile with its top
functions by own time and by cumulative time. Writes ``request_host_<gpu>.{json,md}``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lab  # noqa: E402
import serve_alone  # noqa: E402
import serve_reasoning as sr  # noqa: E402


def measure(method: str, level: int, args, pair) -> dict:
    shape = sr.shapes(args.scale)
    cfg = sr.alone_cfg(method, shape, "tiny", "cuda", "bfloat16", "auto", level)
    engine = sr.build_engine(cfg, *pair)
    sr.warm(engine, cfg)
    ps = sr.prompts(len(shape[method]), shape["prompt"])
    plain = serve_alone.engine_closed_loop(engine, cfg, ps, level, args.warmup_s, args.window_s)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    profiled = serve_alone.engine_closed_loop(engine, cfg, ps, level, args.warmup_s, args.window_s)
    prof.disable()
    wall = time.perf_counter() - t0
    tables = {}
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(args.top)
        tables[key] = buf.getvalue()
    steps = profiled["steps_per_s"] * args.window_s
    return {"method": method, "concurrency": level, "ms_per_step": 1e3 / plain["steps_per_s"],
            "ms_per_step_profiled": 1e3 / profiled["steps_per_s"], "steps_profiled": steps,
            "profiled_wall_s": wall, "tokens_per_s": plain["tokens_per_s"], "phases": plain.get("phases"),
            "profile": tables}


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--levels", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--methods", nargs="+", default=list(sr.METHODS), choices=sr.METHODS)
    ap.add_argument("--scale", type=float, default=0.05)
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--window-s", type=float, default=4.0)
    ap.add_argument("--top", type=int, default=45)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("request_host_gpu.py times the real path's launches: it needs CUDA (request_host.py: CPU)")
    pair = lab.random_pair("tiny", "cuda", torch.bfloat16)
    for m in pair:
        m.generation_config.eos_token_id = None
    rows = []
    for method in args.methods:
        for level in args.levels:
            rows.append(measure(method, level, args, pair))
            print(f"[{method} c={level}] {rows[-1]['ms_per_step']:.2f} ms a step "
                  f"({rows[-1]['ms_per_step_profiled']:.2f} under cProfile)", flush=True)
    doc = {**lab.environment(["cuda"]), "rows": rows}
    device = doc["devices"][0]
    lines = [f"# The request engine's host work a step, tiny pair on {device}", "",
             f"torch {doc['torch']}, transformers {doc['transformers']}, {doc['date']}; the serving closed loop "
             f"(scale {args.scale}, decisions on the device), a tiny random pair: a step's wall time is the host's.",
             "", "| method | clients | ms a step | under cProfile | tokens/s |", "|---|---|---|---|---|"]
    lines += [f"| {r['method']} | {r['concurrency']} | {r['ms_per_step']:.2f} | {r['ms_per_step_profiled']:.2f} | "
              f"{r['tokens_per_s']:.0f} |" for r in rows]
    for r in rows:
        for key, text in r["profile"].items():
            lines += ["", f"## {r['method']}, {r['concurrency']} clients: by {key}", "", "```", text.strip(), "```"]
    lab.write_result(args.out_dir / f"request_host_{lab.file_tag('cuda')}", doc, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
