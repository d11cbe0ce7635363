"""Where one B = 1 decode token of the fast engine goes, per model shape: loop, graph, host, kernels, floor.

    PYTHONPATH=$PWD python benchmarks/engine_profile.py --shapes qwen3-0.6b qwen2-1.5b qwen2-7b --out $OUT/p.json
    PYTHONPATH=$PWD python benchmarks/engine_profile.py --cpu-smoke --out /tmp/p.json   # checks the script
    PYTHONPATH=$PWD python benchmarks/engine_profile.py --host-cpu   # the loop's own host cost, stand-in lanes

For each shape (random weights, bf16, one model as both halves of the pair, the ``"auto"`` engine's
configuration, :data:`hf_rstitch.fast.engine.AUTO`) it measures, at B = 1:

* ``loop_ms``: a token as ``generate`` sees it, the SLM writing every token -- once with the routes
  replayed on the host (``replay``: no decision to read back) and once with an entropy threshold of 1
  (``entropy``: the real policy, its decision read back from the device each step). Per token =
  (wall of 288 new tokens - wall of 32) / 256, so prefill and start-up cancel.
* ``graph_ms``: the decode step's CUDA graph replayed alone, back to back (CUDA events), and
  ``graph_readout_ms`` with the lane's logits read-out (entropy, greedy token) after each replay.
* inside the ``entropy`` loop, per token: ``host_busy_ms`` (wall minus the time the host sat in the
  loop's device waits: Python, dispatch and launches), ``host_wait_ms``, ``replay_host_ms`` (the replay
  call itself), ``graph_in_loop_ms`` (device time of the replays, events around them) and
  ``device_outside_graph_ms`` (the token's period minus its graph: kernels outside the graph plus idle).
* ``kernels``: ``torch.profiler`` over steps of the same lane run eagerly (``graphs=False``: the kernels a
  graph records, plus the read-out): kernels per step, device ms per step, by family, the top 15.
* ``host_profile`` (first shape only): cProfile of the ``entropy`` loop, the top functions by own time, in
  microseconds a token -- where the host's time goes.
* ``floor_ms``: bytes a decode step must read (weights, tied embeddings once) / the measured
  device-to-device copy bandwidth (bytes read + written).

``--host-cpu`` measures on the CPU what the loop itself costs the host a step, over stand-in lanes whose calls
cost next to nothing, and a FastLane call's host path (:mod:`host_standin`; results/engine_host_cpu.md).

The last line printed is a compact table (JSON).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import hf_rstitch  # noqa: F401  (patches generate)
import engine_shapes
import lab
from hf_rstitch import ReplayPolicy
from hf_rstitch.core.roles import Role
from hf_rstitch.fast import FastConfig, FastEngine, FastLane

SHAPES = [*engine_shapes.SHAPES, "tiny-qwen3"]  # engine_shapes' published shapes, and a tiny one for the CPU
FAMILIES = (  # first match wins; names as CUDA / CPU profilers print them
    ("attention", ("attention", "fmha", "flash", "softmax", "sdpa", "split_kernel", "combine_kernel")),
    ("gemv/gemm", ("gemv", "gated", "gemm", "matmul", "mm", "cublas", "cutlass", "linear", "nvjet", "sm90")),
    ("rope/store", ("rotate", "rope", "store")),
    ("norm", ("norm", "rsqrt", "mean")),
    ("readout", ("chunk_kernel", "merge_kernel")),
    ("copy", ("copy", "memcpy", "index", "cat", "scatter", "gather", "fill")),
    ("elementwise", ("elementwise", "vectorized", "mul", "add", "pow", "neg", "silu", "exp", "where", "unrolled")),
)
PROMPT = 128


def family(name: str) -> str:
    low = name.lower()
    return next((fam for fam, keys in FAMILIES if any(k in low for k in keys)), "other")


def summarize(events, n: int) -> dict:
    """Device kernel ``events`` of ``n`` steps, per step: count, time, by family, costliest names
    (engine_warmup.py's profile of graph replays)."""
    fams: dict[str, list] = {}
    names: dict[str, float] = {}
    for e in events:
        f = fams.setdefault(family(e.name), [0, 0.0])
        f[0] += 1
        f[1] += e.device_time
        names[e.name[:90]] = names.get(e.name[:90], 0.0) + e.device_time
    top = sorted(names.items(), key=lambda kv: -kv[1])[:12]
    return {"kernels_per_token": len(events) / n, "kernel_ms_per_token": sum(f[1] for f in fams.values()) / 1e3 / n,
            "by_family": {k: {"kernels": c / n, "ms": us / 1e3 / n} for k, (c, us) in fams.items()},
            "top_kernels_ms": {k: us / 1e3 / n for k, us in top}}


def decode_steps(lane, ids: torch.Tensor, n: int, sync) -> float:
    """A bare lane loop: prefill ``ids`` then ``n`` greedy one-token steps; seconds a step (engine_warmup.py)."""
    rows, resumed = torch.ones(1, dtype=torch.bool), torch.zeros(1, dtype=torch.bool)
    t = ids.shape[1]
    buf = torch.cat([ids, ids.new_zeros(1, n + 1)], dim=1)
    mask = torch.ones_like(buf)
    logits, _, _ = lane.advance(buf[:, :t], mask[:, :t], rows, resumed)
    buf[:, t] = logits.argmax(-1)
    sync()
    t0 = time.perf_counter()
    for i in range(1, n + 1):
        logits, _, _ = lane.advance(buf[:, : t + i], mask[:, : t + i], rows, resumed)
        buf[:, t + i] = logits.argmax(-1)
    sync()
    return (time.perf_counter() - t0) / n


def build(shape: str, device: str):
    """A random-weight bf16 model of ``shape`` (:data:`SHAPES`; ``tiny-qwen3``: a few-MB Qwen3) on ``device``."""
    if shape == "tiny-qwen3":
        return engine_shapes.build("qwen3-0.6b", device, tiny=True)
    return engine_shapes.build(shape, device)


def config(device: str) -> FastConfig:
    from hf_rstitch.fast.engine import AUTO

    return AUTO if device == "cuda" else FastConfig(graphs=False)


def generate_once(model, engine, ids, new: int, policy: str):
    kw = {"stitch_policy": ReplayPolicy(["slm"])} if policy == "replay" else {"stitch_threshold": 1.0}
    return model.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=model, stitch_engine=engine,
                          max_new_tokens=new, do_sample=False, **kw)


class Waits:
    """Time the host spends in the loop's device waits (the stopping flags, the policy's decision) and around
    each graph replay (host call; device time by events), while installed."""

    def __init__(self):
        from hf_rstitch.decode import loop, step
        from hf_rstitch.fast import graphs

        self.wait_s, self.replay_host_s, self.events = 0.0, 0.0, []
        self._undo = [(loop._HostFlags, "wait", loop._HostFlags.wait), (step, "on_host", step.on_host),
                      (graphs.GraphRunner, "run", graphs.GraphRunner.run)]
        flags_wait, on_host, run = (fn for _, _, fn in self._undo)

        def timed(fn):
            def wrapper(*a, **k):
                t0 = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    self.wait_s += time.perf_counter() - t0
            return wrapper

        def timed_run(runner, key, fn):
            if key not in runner.graphs:
                return run(runner, key, fn)
            pre, post = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            pre.record()
            out = run(runner, key, fn)
            post.record()
            self.replay_host_s += time.perf_counter() - t0
            self.events.append((pre, post))
            return out

        loop._HostFlags.wait, step.on_host, graphs.GraphRunner.run = timed(flags_wait), timed(on_host), timed_run

    def close(self) -> float:
        for owner, name, fn in self._undo:
            setattr(owner, name, fn)
        torch.cuda.synchronize()
        return sum(a.elapsed_time(b) for a, b in self.events) / 1e3


def loop_times(model, engine, ids, policy: str, device: str) -> dict:
    """Per token through generate, the SLM writing every token; with ``entropy`` also where the time goes."""
    short, long_ = 32, 288
    generate_once(model, engine, ids, 8, policy)  # every graph this route needs, captured
    t_short, _ = lab.timed(lambda: generate_once(model, engine, ids, short, policy), device, repeats=3)
    t_long, _ = lab.timed(lambda: generate_once(model, engine, ids, long_, policy), device, repeats=3)
    n = long_ - short
    row = {"loop_ms": 1e3 * (t_long - t_short) / n}
    if policy != "entropy" or device != "cuda":
        return row
    per = {}
    for new in (short, long_):  # the same difference of two generations, instrumented
        waits = Waits()
        lab.sync(device)
        t0 = time.perf_counter()
        generate_once(model, engine, ids, new, policy)
        lab.sync(device)
        wall = time.perf_counter() - t0
        graph = waits.close()
        per[new] = (wall, waits.wait_s, waits.replay_host_s, graph)
    d = [(b - a) / n * 1e3 for a, b in zip(per[short], per[long_])]
    row.update(instrumented_loop_ms=d[0], host_busy_ms=d[0] - d[1], host_wait_ms=d[1], replay_host_ms=d[2],
               graph_in_loop_ms=d[3], device_outside_graph_ms=d[0] - d[3])
    return row


def bare_graph(lane: FastLane, repeats: int = 200) -> dict:
    """The lane's one-token graph replayed back to back at ~PROMPT + 150 columns, without and with the read-out."""
    from hf_rstitch.fast.kernels import fused_entropy

    graph, (logits, _) = lane.graphs.graphs[(1, 1, False)]  # the step's outputs: (logits, hidden)
    out = {}
    for name, read in (("graph_ms", False), ("graph_readout_ms", True)):
        times = []
        for _ in range(5):
            lane.cache.pos.fill_(PROMPT + 150)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats // 5):
                graph.replay()
                if read:
                    fused_entropy.read_out(logits[:1])
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / (repeats // 5))
        out[name] = statistics.median(times)
    lane.reset()
    return out


def kernel_profile(model, steps: int, device: str) -> dict:
    """Kernels of ``steps`` one-token steps of an eager lane (``graphs=False``), read-out included."""
    lane = FastLane(model, Role.SLM, model.config.vocab_size, PROMPT + 2 * steps + 16,
                    FastConfig(**{**config(device).__dict__, "graphs": False}))
    ids = torch.randint(10, min(1000, model.config.vocab_size), (1, PROMPT + 2 * steps + 8), device=device)
    mask = torch.ones_like(ids)
    yes = torch.ones(1, dtype=torch.bool)

    def run(first: int, n: int):
        for t in range(first, first + n):
            lane.advance(ids[:, :t], mask[:, :t], yes, ~yes)

    run(PROMPT, 4)  # prefill, compiles, loads
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    lab.sync(device)
    with torch.profiler.profile(activities=activities) as prof:
        run(PROMPT + 4, steps)
        lab.sync(device)
    on_device = device == "cuda"
    events = [e for e in prof.events() if (e.device_type == torch.autograd.DeviceType.CUDA) == on_device]
    if not on_device:  # no device kernels: the leaf aten ops instead
        events = [e for e in events if e.name.startswith("aten::") and not e.cpu_children]
    fams, names = {}, {}
    for e in events:
        us = e.device_time if on_device else e.cpu_time
        f = fams.setdefault(family(e.name), [0, 0.0])
        f[0] += 1
        f[1] += us
        c = names.setdefault(e.name[:100], [0, 0.0])
        c[0] += 1
        c[1] += us
    top = sorted(names.items(), key=lambda kv: -kv[1][1])[:15]
    del lane
    return {"kernels_per_step": len(events) / steps,
            "kernel_ms_per_step": sum(f[1] for f in fams.values()) / 1e3 / steps,
            "by_family": {k: {"kernels": c / steps, "ms": us / 1e3 / steps}
                          for k, (c, us) in sorted(fams.items(), key=lambda kv: -kv[1][1])},
            "top15": [{"name": k, "per_step": c / steps, "ms": us / 1e3 / steps} for k, (c, us) in top]}


def first_call_parts(engine: FastEngine) -> dict:
    """Where the first call's seconds went: GEMV tuning (kernels built ahead + timed), graph captures (their
    warm-up runs and compiles included), dynamo / inductor phases (this process so far), graphs captured."""
    from torch._dynamo.utils import compilation_time_metrics

    lanes = engine._lanes.values()
    phases = sorted(((k, sum(v)) for k, v in compilation_time_metrics.items()), key=lambda kv: -kv[1])[:8]
    return {"tune_s": sum(l.gemv_tune_seconds for l in lanes), "capture_s": engine.capture_seconds(),
            "graphs": engine.graph_count(), "compile_phases_s": dict(phases)}


def profile_shape(shape: str, args, device: str, bw_gbps: float) -> dict:

    model = build(shape, device)
    facts = lab.weight_bytes(model)
    row = {"shape": shape, "floor_ms": 1e3 * facts["decode_read_bytes"] / (bw_gbps * 1e9), **facts}
    ids = torch.randint(10, model.config.vocab_size - 10, (1, PROMPT),
                        generator=torch.Generator().manual_seed(0)).to(device)
    engine = FastEngine(config(device), capacity=1024)
    row["first_call_s"], _ = lab.timed(lambda: generate_once(model, engine, ids, 4, "replay"), device)
    row["first_call"] = first_call_parts(engine)
    row["every_bucket_s"] = sum(lane.warm_up() for lane in engine._lanes.values())  # what later calls would capture
    for policy in ("replay", "entropy"):
        row[policy] = loop_times(model, engine, ids, policy, device)
    if device == "cuda":
        row.update(bare_graph(engine._lanes[Role.SLM]))
    if args.host_profile and shape == args.shapes[0]:
        row["host_profile"] = host_profile(model, engine, ids)
    del engine
    row["kernels"] = kernel_profile(model, args.steps, device)
    row["x_floor"] = row["replay"]["loop_ms"] / row["floor_ms"]
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict]) -> list[dict]:
    keys = ("floor_ms", "graph_ms", "graph_readout_ms")
    out = []
    for r in rows:
        e = r["entropy"]
        out.append({"shape": r["shape"], **{k: round(r[k], 3) for k in keys if k in r},
                    "replay_ms": round(r["replay"]["loop_ms"], 3), "entropy_ms": round(e["loop_ms"], 3),
                    **{k: round(e[k], 3) for k in ("host_busy_ms", "host_wait_ms", "device_outside_graph_ms") if k in e},
                    "kernels": round(r["kernels"]["kernels_per_step"], 1),
                    "kernel_ms": round(r["kernels"]["kernel_ms_per_step"], 3), "x_floor": round(r["x_floor"], 2),
                    "first_call_s": round(r["first_call_s"], 1), "tune_s": round(r["first_call"]["tune_s"], 1),
                    "capture_s": round(r["first_call"]["capture_s"], 1), "every_bucket_s": round(r["every_bucket_s"], 1)})
    return out


def host_profile(model, engine, ids, top: int = 30) -> list[dict]:
    """cProfile of the ``entropy`` loop: 288 new tokens minus 32, per token, the ``top`` functions by own time."""
    import cProfile
    import pstats

    per = {}
    for new in (32, 288):
        prof = cProfile.Profile()
        prof.enable()
        generate_once(model, engine, ids, new, "entropy")
        prof.disable()
        per[new] = pstats.Stats(prof).stats  # {(file, line, name): (cc, nc, tottime, cumtime, callers)}
    rows = []
    for key, (_, calls, own, cum, _) in per[288].items():
        _, c0, o0, u0, _ = per[32].get(key, (0, 0, 0.0, 0.0, None))
        rows.append({"fn": f"{Path(key[0]).name}:{key[1]}({key[2]})", "calls_per_token": (calls - c0) / 256,
                     "own_us": 1e6 * (own - o0) / 256, "cum_us": 1e6 * (cum - u0) / 256})
    return sorted(rows, key=lambda r: -r["own_us"])[:top]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["qwen3-0.6b", "qwen2-1.5b", "qwen2-7b"], choices=sorted(SHAPES))
    ap.add_argument("--steps", type=int, default=32, help="eager steps under torch.profiler")
    ap.add_argument("--budget-s", type=float, default=110, help="skip shapes once this many seconds have passed")
    ap.add_argument("--host-profile", action=argparse.BooleanOptionalAction, default=True,
                    help="cProfile the first shape's entropy loop (host time by function)")
    ap.add_argument("--cpu-smoke", action="store_true", help="a tiny model on the CPU, no graphs: checks the script")
    ap.add_argument("--host-cpu", action="store_true", help="the loop's host cost a step over stand-in lanes, on the CPU")
    ap.add_argument("--label", default="this tree", help="--host-cpu: the row's name (rows of other labels are kept)")
    ap.add_argument("--out", default="benchmarks/results/engine_profile.json")
    args = ap.parse_args()
    if args.host_cpu:
        torch.set_num_threads(1)
        from host_standin import HOST_RESULT, host_cpu, write_host_rows

        row = {"label": args.label, **{k: round(v, 1) for k, v in host_cpu().items()}}
        write_host_rows(Path(args.out if args.out != ap.get_default("out") else HOST_RESULT), row)
        print(json.dumps(row))
        return 0
    device = "cpu" if args.cpu_smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA device; use --cpu-smoke to check the script")
    if args.cpu_smoke:
        args.shapes, args.steps = ["tiny-qwen3"], 4
    start = time.perf_counter()

    bw = lab.copy_bandwidth(device) if device == "cuda" else 100.0
    doc = {**lab.environment([device]), "bandwidth_gbps": bw, "rows": [], "skipped": []}
    for shape in args.shapes:
        if time.perf_counter() - start > args.budget_s:
            doc["skipped"].append(shape)
            continue
        doc["rows"].append(profile_shape(shape, args, device, bw))
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    doc["seconds"] = time.perf_counter() - start
    Path(args.out).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(json.dumps({"device": doc["devices"], "bandwidth_gbps": round(bw), "skipped": doc["skipped"],
                      "rows": table(doc["rows"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
