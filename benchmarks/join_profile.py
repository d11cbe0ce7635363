"""Where a serving step's device time goes, kernel by kernel, joins apart: torch.profiler over the engine alone.

    PYTHONPATH=$PWD:$PWD/benchmarks python benchmarks/join_profile.py --out-dir $OUT --levels 256 --methods llm_only stitched
    PYTHONPATH=$PWD:$PWD/benchmarks python benchmarks/join_profile.py --dry-run-cpu --out-dir /tmp/jp   # checks it
    PYTHONPATH=$PWD:$PWD/benchmarks python benchmarks/join_profile.py --out-dir $OUT --levels 8 64 --methods stitched \
        --kernels join advance:slm advance:llm --tag _lanes   # each lane's kernels against its weight-read floor

``serve_reasoning.py``'s engine alone (its MATH-shaped requests, replayed routes with decisions on the device, the
random Qwen2 7B / 1.5B pair, ``rstitch serve``'s engine) in its closed loop; after ``--warmup-s`` seconds,
``torch.profiler`` records ``--steps`` steps. Each step runs in a named range, as do its parts: ``join`` (the
executor's join: the joining rows' prefill in every lane, at a step's start or ahead of it), ``admit`` (the
scheduler's admission), ``advance:<role>`` (a lane's call) and ``run_ahead`` (the next step's first call queued early).
Every device operation (kernel, copy, memset) is charged to the innermost range whose host span holds the runtime call
that launched it (a CUDA graph's kernels to the range that replayed it).

Per range, a call: host ms, device busy ms (the sum of its operations' durations), device span ms (its first
operation's start to its last one's end: busy plus the device's gaps inside, e.g. waiting for the host's next
launch), launches and graph replays; and the device operations by total time of the ranges ``--kernels`` names (joins
by default). With the weight-read floor of each
model (parameter bytes / the device's copy bandwidth), it says whether a join costs what its weight reads cost or
more, and where the rest goes. Writes ``join_profile_<gpu>.{json,md}``.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lab  # noqa: E402
import serve_alone  # noqa: E402
import serve_reasoning as sr  # noqa: E402

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")  # Triton launches through the driver API (cuLaunchKernel)


def _parts(engine) -> list[tuple[object, str, str]]:
    """``(object, attribute, range name)`` of the engine's step and the parts of it that get a range."""
    return [(engine, "step", "step"), (engine.executor, "join", "join"), (engine.scheduler, "_admit", "admit"),
            *((lane, "advance", f"advance:{role}") for role, lane in engine.lanes.items())]


def install_ranges(engine, record_function) -> None:
    """Named ranges around the engine's step and its parts (instance attributes, as the phase profile's
    :class:`serve_alone.Phases`, whose removal drops them: install after it is gone)."""
    import hf_rstitch.batching.executor as executor_module

    def ranged(name, fn):
        def call(*args, **kwargs):
            with record_function(name):
                return fn(*args, **kwargs)
        return call

    for obj, attr, name in _parts(engine):
        setattr(obj, attr, ranged(name, getattr(obj, attr)))
    if not getattr(executor_module.run_ahead, "ranged", False):  # once a process (a module-level function)
        executor_module.run_ahead = ranged("run_ahead", executor_module.run_ahead)
        executor_module.run_ahead.ranged = True


def remove_ranges(engine) -> None:
    for obj, attr, _ in _parts(engine):
        obj.__dict__.pop(attr, None)


def attribute(trace: dict) -> dict:
    """Per range name: its calls (host ms, device busy ms, device span ms, launches, graph replays), and the device
    operations of each name by total ms, from a chrome trace of ``torch.profiler``."""
    events = trace["traceEvents"]
    ranges = sorted((e for e in events if e.get("cat") == "user_annotation" and e.get("ph") == "X"),
                    key=lambda e: e["ts"])
    device = collections.defaultdict(list)  # correlation -> device operations
    for e in events:
        if e.get("cat") in DEVICE_CATS and "correlation" in e.get("args", {}):
            device[e["args"]["correlation"]].append(e)
    calls = [{"name": r["name"], "ts": r["ts"], "end": r["ts"] + r["dur"], "host_us": r["dur"], "ops": [],
              "launches": 0, "graphs": 0} for r in ranges]
    unranged = {"ops": 0, "us": 0.0}  # device operations launched outside every range (a sanity total)
    starts = [c["ts"] for c in calls]
    for e in events:
        if e.get("cat") not in LAUNCH_CATS or "correlation" not in e.get("args", {}):
            continue
        ops = device.get(e["args"]["correlation"])
        if not ops:
            continue
        owner = _innermost(calls, starts, e["ts"])
        if owner is None:
            unranged["ops"] += len(ops)
            unranged["us"] += sum(o["dur"] for o in ops)
            continue
        owner["ops"] += ops
        owner["launches"] += 1
        owner["graphs"] += "Graph" in e["name"]
    out = summarize(calls)
    out["outside_ranges"] = {"ops": unranged["ops"], "device_ms": unranged["us"] / 1e3}
    return out


def _innermost(calls: list[dict], starts: list[float], ts: float) -> dict | None:
    """The shortest range holding ``ts`` (ranges nest: a step holds its parts)."""
    best = None
    i = bisect.bisect_right(starts, ts)
    for c in calls[max(0, i - 64):i]:  # ranges starting before ts; a step holds at most a few dozen
        if c["ts"] <= ts <= c["end"] and (best is None or c["host_us"] < best["host_us"]):
            best = c
    return best


def summarize(calls: list[dict]) -> dict:
    out = {}
    for name in dict.fromkeys(c["name"] for c in calls):
        mine = [c for c in calls if c["name"] == name]
        busy = [sum(o["dur"] for o in c["ops"]) for c in mine]
        span = [(max(o["ts"] + o["dur"] for o in c["ops"]) - min(o["ts"] for o in c["ops"])) if c["ops"] else 0.0
                for c in mine]
        kernels = collections.Counter()
        for c in mine:
            for o in c["ops"]:
                kernels[_short(o["name"])] += o["dur"]
        n = len(mine)
        out[name] = {"calls": n, "host_ms": sum(c["host_us"] for c in mine) / n / 1e3,
                     "device_busy_ms": sum(busy) / n / 1e3, "device_span_ms": sum(span) / n / 1e3,
                     "launches": sum(c["launches"] for c in mine) / n, "graph_replays": sum(c["graphs"] for c in mine) / n,
                     "ops": sum(len(c["ops"]) for c in mine) / n,
                     "top_ops_ms_per_call": {k: v / n / 1e3 for k, v in kernels.most_common(12)}}
    return out


def _short(name: str) -> str:
    name = re.sub(r"<.*", "", name)  # templates
    return name[:90]


def weight_floor_ms(model, bandwidth: float) -> float:
    """One read of the model's parameters at ``bandwidth`` bytes/s (the decode floor at small batch)."""
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return 1e3 * nbytes / bandwidth


def profile_level(engine, cfg, ps, level: int, args, profiler_mod) -> dict:
    """The closed loop at ``level``; ``args.steps`` steps under the profiler after ``args.warmup_s``."""
    state = {"prof": None, "steps": 0}

    def on_step(elapsed: float) -> None:
        if state["prof"] is None and elapsed >= args.warmup_s + 0.25 and state["steps"] == 0:  # the loop's own
            # phase profile (the warm-up's second half) removed first: its removal drops instance attributes
            install_ranges(engine, profiler_mod.record_function)
            acts = [profiler_mod.ProfilerActivity.CPU] + ([profiler_mod.ProfilerActivity.CUDA] if args.device == "cuda"
                                                          else [])
            state["prof"] = profiler_mod.profile(activities=acts)
            state["prof"].start()
        elif state["prof"] is not None and state["steps"] >= 0:
            state["steps"] += 1
            if state["steps"] == args.steps:
                import torch

                if args.device == "cuda":
                    torch.cuda.synchronize()
                state["prof"].stop()
                remove_ranges(engine)
                state["steps"] = -1  # done

    loop = serve_alone.engine_closed_loop(engine, cfg, ps, level, args.warmup_s, args.window_s, on_step=on_step)
    if state["prof"] is None:
        raise SystemExit(f"level {level}: the loop ended before the profiler started; raise --window-s")
    if state["steps"] != -1:
        state["prof"].stop()
        remove_ranges(engine)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        state["prof"].export_chrome_trace(str(path))
        ranges = attribute(json.loads(path.read_text()))
    outside = ranges.pop("outside_ranges")
    return {"concurrency": level, "profiled_steps": args.steps, "tokens_per_s_unprofiled_window": loop["tokens_per_s"],
            "phases": loop.get("phases"), "ranges": ranges, "outside_ranges": outside}


def markdown(doc: dict) -> str:
    lines = [f"# Where a serving step's device time goes, joins apart: {doc['gpu']}", "",
             f"{doc['pair']}; MATH-shaped requests scaled by {doc['scale']}, the engine alone's closed loop, "
             f"{doc['steps']} steps under torch.profiler after {doc['warmup_s']} s. Per call of each range: host ms, "
             "device busy ms (its operations' durations summed), device span ms (first operation's start to the last "
             "one's end), launches (runtime calls that put work on the device) and graph replays. Weight-read floor "
             f"at {doc['bandwidth_gb_s']:.0f} GB/s (device copy): " +
             ", ".join(f"{k} {v:.2f} ms" for k, v in doc["floor_ms"].items()) + ".", "",
             "| method | clients | range | calls | host ms | device busy ms | device span ms | launches | graph replays |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        for name, s in r["ranges"].items():
            lines.append(f"| {r['method']} | {r['concurrency']} | {name} | {s['calls']} | {s['host_ms']:.2f} | "
                         f"{s['device_busy_ms']:.2f} | {s['device_span_ms']:.2f} | {s['launches']:.1f} | "
                         f"{s['graph_replays']:.1f} |")
    lines += ["", "Device operations launched outside every range (the profiler's start and stop, a sanity total): " +
              "; ".join(f"{r['method']} at {r['concurrency']}: {r['outside_ranges']['ops']} operations, "
                        f"{r['outside_ranges']['device_ms']:.2f} ms" for r in doc["rows"] if "outside_ranges" in r)]
    for name in doc.get("kernels", ["join"]):
        lines += ["", f"Device operations of `{name}`, by ms a call (the 12 largest):", ""]
        for r in doc["rows"]:
            j = r["ranges"].get(name)
            if j:
                lines.append(f"- {r['method']} at {r['concurrency']} clients: " +
                             "; ".join(f"`{k}` {v:.3f}" for k, v in j["top_ops_ms_per_call"].items()))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import torch.profiler as profiler_mod

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--methods", nargs="+", default=list(sr.METHODS), choices=sr.METHODS)
    ap.add_argument("--levels", type=int, nargs="+", default=[256], help="concurrencies")
    ap.add_argument("--scale", type=float, default=0.05, help="factor on every token count (serve_reasoning.py's)")
    ap.add_argument("--warmup-s", type=float, default=3.0, help="seconds of the closed loop before the profiler")
    ap.add_argument("--window-s", type=float, default=3.0, help="seconds after: the profiled steps must fit in it")
    ap.add_argument("--steps", type=int, default=40, help="steps under the profiler")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tag", default="")
    ap.add_argument("--kernels", nargs="+", default=["join"], metavar="RANGE",
                    help="ranges whose device operations the table lists by time: join, admit, advance:slm, "
                         "advance:llm, run_ahead, step (the JSON holds them for every range)")
    ap.add_argument("--dry-run-cpu", action="store_true", help="tiny pair on CPU, tiny counts: checks the whole path")
    args = ap.parse_args(argv)
    if args.dry_run_cpu:
        args.device, args.dtype = "cpu", "float32"
        args.scale, args.levels, args.steps = min(args.scale, 0.01), [4], min(args.steps, 6)
        args.warmup_s, args.window_s = min(args.warmup_s, 0.5), min(args.window_s, 1.5)
    shape = sr.shapes(args.scale)
    gpu = lab.file_tag(args.device)
    pair_cfg = {"pair": "tiny" if args.dry_run_cpu else "qwen2", "device": args.device, "dtype": args.dtype}
    llm, slm = sr.build_pair(pair_cfg)
    bandwidth = 1e9 * (lab.copy_bandwidth() if args.device == "cuda" else 10.0)  # bytes/s (copy_bandwidth: GB/s)
    doc = {**lab.environment([args.device]), "gpu": gpu, "scale": args.scale, "steps": args.steps,
           "warmup_s": args.warmup_s, "pair": "tiny random Qwen2 pair (CPU dry run)" if args.dry_run_cpu
           else f"random Qwen2 7B / 1.5B, {args.dtype}", "bandwidth_gb_s": bandwidth / 1e9,
           "floor_ms": {"llm": weight_floor_ms(llm, bandwidth), "slm": weight_floor_ms(slm, bandwidth)}, "rows": [],
           "kernels": args.kernels}
    stem = Path(args.out_dir) / f"join_profile_{gpu}{args.tag}"
    for method in args.methods:
        cfg = sr.alone_cfg(method, shape, pair_cfg["pair"], args.device, args.dtype,
                           "default" if args.dry_run_cpu else "auto", max(args.levels))
        engine = sr.build_engine(cfg, llm, slm)
        sr.warm(engine, cfg)
        ps = sr.prompts(len(shape[method]), shape["prompt"])
        for level in args.levels:
            row = {"method": method, **profile_level(engine, cfg, ps, level, args, profiler_mod)}
            doc["rows"].append(row)
            print(f"[{method} c={level}] " + json.dumps({k: {kk: round(vv, 3) for kk, vv in v.items()
                                                             if isinstance(vv, float)}
                                                         for k, v in row["ranges"].items()}), file=sys.stderr, flush=True)
            lab.write_result(stem, doc, markdown(doc))
        del engine
        sr._free_device_memory()
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
