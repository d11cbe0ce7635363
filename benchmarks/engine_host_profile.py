"""Where the host spends a fast-engine generation: cProfile of one-model decoding (one GPU, B = 1 or more).

    PYTHONPATH=. python benchmarks/engine_host_profile.py --out $OUT/host_profile.json   # CUDA, ~1 min
    PYTHONPATH=. python benchmarks/engine_host_profile.py --batch 64 --out $OUT/host_profile_b64.json
    PYTHONPATH=. python benchmarks/engine_host_profile.py --cpu-smoke --out /tmp/h.json  # checks the script

``generate(..., stitch_engine=engine)`` cost ~0.4-1.4 ms per token more than the same lane
driven by a bare loop (benchmarks/results/engine_nvidia_h200*.json). This script says where:
it decodes ``--new`` tokens with a replayed all-LLM route through ``generate`` under cProfile
(graphs already captured), and reports per token the wall time, the bare lane's time, and the
host functions with the most own time -- a device wait shows up as the call that synchronises
(``.cpu()`` / ``.item()`` / ``.tolist()``), host work as everything else. A device kernel profile of
the same generation says how much of each step the GPU was busy (``kernel_ms_per_token`` against
``ms_per_token``) and which kernels ran outside the graphs.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import functools
import json
import pstats
import statistics
import time
from pathlib import Path

import torch
import transformers

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch import ReplayPolicy
from hf_rstitch.fast import FastConfig, FastEngine, triton_support
from engine_profile import family
from lab import sync


def build(cpu: bool):
    """(llm, slm): random Qwen2 7B + 1.5B shapes on the GPU, engine_bench's tiny pair for the CPU smoke."""
    from engine_bench import tiny_pair  # noqa: E402  (this folder is on the path when run as a script)
    from hf_rstitch.latency.profiler import random_qwen2

    if not cpu:
        return random_qwen2("7b"), random_qwen2("1.5b")
    pair = tiny_pair()
    return pair["llm"], pair["slm"]


def device_kernels(gen, n: int) -> dict[str, dict[str, list]]:
    """A generation of ``n`` tokens under the profiler: per device kernel, per CUDA runtime call (host side)
    and per device idle gap (named by the kernels around it), ``[count, microseconds]``."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        gen(n)
    out: dict[str, dict[str, list]] = {"kernels": {}, "runtime": {}, "gaps": {}}

    def add(table, name, us):
        k = out[table].setdefault(name, [0, 0.0])
        k[0] += 1
        k[1] += us

    spans = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            add("kernels", e.name[:90], e.device_time)
            spans.append((e.time_range.start, e.time_range.end, e.name[:40]))
        elif e.name.startswith("cuda") and not e.name.startswith("cudaEvent"):
            add("runtime", e.name, e.cpu_time_total)
    spans.sort()
    for (_, end, before), (start, _, after) in zip(spans, spans[1:]):
        if start - end > 2:  # microseconds the device sat idle between two kernels
            add("gaps", f"{before} -> {after}", start - end)
    return out


def kernel_steps(gen, n: int) -> dict:
    """Device kernels of one decode step: a generation of ``2n`` tokens less one of ``n`` (the prefill and
    start-up cancel), per step -- each kernel's count and ms, by family; the CUDA runtime calls' host time;
    the device's idle gaps between kernels, by the kernels around them."""
    short, long_ = device_kernels(gen, n), device_kernels(gen, 2 * n)

    def per_step(table):
        a, b = short[table], long_[table]
        rows = {k: [(c - a.get(k, [0, 0.0])[0]) / n, (us - a.get(k, [0, 0.0])[1]) / 1e3 / n] for k, (c, us) in b.items()}
        return sorted(rows.items(), key=lambda kv: -kv[1][1])

    kernels = per_step("kernels")
    fams: dict[str, list] = {}
    for name, (c, ms) in kernels:
        f = fams.setdefault(family(name), [0.0, 0.0])
        f[0] += c
        f[1] += ms
    listed = lambda rows: [{"name": k, "per_step": c, "ms_per_step": ms} for k, (c, ms) in rows[:40]]  # noqa: E731
    gaps = per_step("gaps")
    return {"kernels_per_step": sum(c for _, (c, _) in kernels),
            "kernel_ms_per_step": sum(ms for _, (_, ms) in kernels),
            "idle_ms_per_step": sum(ms for _, (_, ms) in gaps),
            "by_family": {k: {"kernels": c, "ms": ms} for k, (c, ms) in fams.items()},
            "kernels": listed(kernels), "runtime_calls": listed(per_step("runtime")), "idle_gaps": listed(gaps)}


class Timeline:
    """Per step (the median), without a profiler: host seconds from the step's wait for the device returning to the next
    graph replay, the replay call itself, and from there to the next wait; device seconds of the graph
    (events around each replay) and between graphs (the eager kernels after a graph, plus idle time)."""

    def __init__(self):
        from hf_rstitch.engine import loop
        from hf_rstitch.fast import graphs

        self.marks: list[tuple[str, float, object]] = []
        self._undo = []
        run, wait = graphs.GraphRunner.run, loop._HostFlags.wait
        marks = self.marks

        def timed_run(runner, key, fn):
            if key not in runner.graphs:
                return run(runner, key, fn)
            pre, post = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            pre.record()
            marks.append(("replay", time.perf_counter(), pre))
            out = run(runner, key, fn)
            post.record()
            marks.append(("replayed", time.perf_counter(), post))
            return out

        def timed_wait(flags):
            marks.append(("wait", time.perf_counter(), None))
            out = wait(flags)
            marks.append(("waited", time.perf_counter(), None))
            return out

        graphs.GraphRunner.run, loop._HostFlags.wait = timed_run, timed_wait
        self._undo = [(graphs.GraphRunner, "run", run), (loop._HostFlags, "wait", wait)]

    def close(self) -> dict:
        for owner, name, fn in self._undo:
            setattr(owner, name, fn)
        torch.cuda.synchronize()
        sums = {"host_waited_to_replay": [], "host_replay_call": [], "host_replayed_to_wait": [], "host_in_wait": [],
                "device_graph": [], "device_between_graphs": []}
        last = {}
        for name, t, event in self.marks:
            if name == "replay" and "waited" in last:
                sums["host_waited_to_replay"].append(t - last["waited"][0])
            if name == "replayed":
                sums["host_replay_call"].append(t - last["replay"][0])
                sums["device_graph"].append(last["replay"][1].elapsed_time(event) / 1e3)
            if name == "replay" and "replayed" in last:
                sums["device_between_graphs"].append(last["replayed"][1].elapsed_time(event) / 1e3)
            if name == "wait" and "replayed" in last:
                sums["host_replayed_to_wait"].append(t - last["replayed"][0])
            if name == "waited":
                sums["host_in_wait"].append(t - last["wait"][0])
            last[name] = (t, event)
        # medians: the prompt's prefill is one of the replays, and at B = 64 it alone (~0.2 s) would add ~0.7 ms
        # to a mean over 256 steps
        return {k: 1e3 * statistics.median(v) if v else 0.0 for k, v in sums.items()} | \
            {"steps": len(sums["device_graph"])}


def lane_loops(engine, ids: torch.Tensor, route: str, n: int, sync) -> dict:
    """The generation's own lane (same engine, graphs, capacity and contexts) driven by bare loops, ms a step:
    ``bare`` graph replays and argmax, ``entropy`` adding the loop's entropy of each step's logits, ``synced``
    adding a wait for the device every step (what the stitch loop's stopping check costs at least). On CUDA
    also ``<loop>_device_graph``: the median graph time in that loop (events around the replays), to set
    against the generation's own ``device_graph``."""
    from engine_profile_batched import Rows

    from hf_rstitch.core.roles import Role

    lane = engine._lanes[Role(route)]
    out = {}
    for name in ("bare", "entropy", "synced"):
        lane.reset()
        rows = Rows(lane, ids, n + n // 4 + 8)  # the prompt's prefill, then one-token steps
        rows._advance = functools.partial(_lane_step, rows, name, sync)
        out[name] = 1e3 * rows.steps(n, sync)
        if torch.cuda.is_available() and lane.device.type == "cuda":  # the graph's own time in this loop
            tl = Timeline()
            rows.steps(n // 4, sync)
            out[f"{name}_device_graph"] = tl.close()["device_graph"]
    lane.reset()
    return out


def _lane_step(rows, name: str, sync) -> None:
    from hf_rstitch.core.entropy import normalized_entropy

    t = rows.t
    logits, _, _ = rows.lane.advance(rows.buf[:, :t], rows.mask[:, :t], rows.rows, rows.resumed)
    if name != "bare":
        normalized_entropy(logits)
    rows.buf[:, t] = logits.argmax(-1)
    rows.t += 1
    if name == "synced":
        sync()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--compile", default=None, choices=[None, "parts", "decode", "all"])
    ap.add_argument("--route", default="llm", choices=["llm", "slm"], help="which model writes every token")
    ap.add_argument("--batch", type=int, default=1, help="rows decoding together (each its own prompt)")
    ap.add_argument("--kernel-tokens", type=int, default=64,
                    help="device kernels per step from generations of this many tokens and twice as many (0: none)")
    ap.add_argument("--pdl", default=triton_support.PDL, choices=["off", "one-row", "all"],
                    help="programmatic dependent launch of the Triton kernels (hf_rstitch.fast.triton_support.PDL; default: its default)")
    ap.add_argument("--cpu-smoke", action="store_true")
    args = ap.parse_args(argv)
    triton_support.PDL = args.pdl
    llm, slm = build(args.cpu_smoke)
    for m in (llm, slm):
        m.generation_config.eos_token_id, m.generation_config.pad_token_id = None, 0
    dev = llm.device
    ids = torch.randint(1, slm.config.vocab_size, (args.batch, 128), device=dev)  # no pad id: no mask holes
    engine = FastEngine(FastConfig(compile=args.compile, graphs=not args.cpu_smoke), capacity=1024,
                        max_batch=args.batch)
    def gen(n):
        sync(dev)
        t0 = time.perf_counter()
        with torch.no_grad():
            routes = [[args.route] * n] * args.batch
            llm.generate(ids, assistant_model=slm, stitch_policy=ReplayPolicy(routes), stitch_engine=engine,
                         max_new_tokens=n, do_sample=False)
        sync(dev)
        return time.perf_counter() - t0

    gen(16), gen(args.new)  # capture every graph
    plain = gen(args.new)
    timeline = None
    if dev.type == "cuda":
        tl = Timeline()
        gen(args.new)
        timeline = tl.close()
        print("timeline, ms a step:", json.dumps({k: round(v, 4) for k, v in timeline.items()}))
        loops = lane_loops(engine, ids, args.route, args.new, lambda: sync(dev))
        timeline["lane_loops_ms"] = loops
        print("the same lane in bare loops, ms a step:", json.dumps({k: round(v, 4) for k, v in loops.items()}))
    prof = cProfile.Profile()
    prof.enable()
    profiled = gen(args.new)
    prof.disable()
    kernels = kernel_steps(gen, args.kernel_tokens) if args.kernel_tokens and dev.type == "cuda" else {}
    stats = pstats.Stats(prof)
    rows = []
    for (file, line, fn), (cc, nc, tt, ct, _) in stats.stats.items():
        rows.append({"function": f"{Path(file).name}:{line}({fn})", "calls": nc, "own_ms_per_token": 1e3 * tt / args.new,
                     "cum_ms_per_token": 1e3 * ct / args.new})
    rows.sort(key=lambda r: -r["own_ms_per_token"])
    res = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu smoke", "torch": torch.__version__,
           "transformers": transformers.__version__, "compile": args.compile, "route": args.route, "pdl": args.pdl,
           "batch": args.batch,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "new_tokens": args.new, "ms_per_token": 1e3 * plain / args.new,
           "ms_per_token_under_cprofile": 1e3 * profiled / args.new, "kernels": kernels, "timeline_ms": timeline,
           "top_own": rows[:40],
           "top_cum": sorted(rows, key=lambda r: -r["cum_ms_per_token"])[:40]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(f"{res['device']} B={args.batch}: {res['ms_per_token']:.3f} ms/step "
          f"({res['ms_per_token_under_cprofile']:.3f} under cProfile); device kernels "
          f"{kernels.get('kernel_ms_per_step', float('nan')):.3f} ms/step, "
          f"{kernels.get('kernels_per_step', 0):.0f}/step, idle between them "
          f"{kernels.get('idle_ms_per_step', float('nan')):.3f} ms/step")
    for table in ("kernels", "runtime_calls", "idle_gaps"):
        print(f"-- {table} (ms a step, times a step)")
        for k in kernels.get(table, [])[:20]:
            print(f"{k['ms_per_step']:8.4f} ms {k['per_step']:6.1f}x  {k['name']}")
    for r in rows[:25]:
        print(f"{r['own_ms_per_token']:8.4f} own {r['cum_ms_per_token']:8.4f} cum {r['calls']:7d}  {r['function']}")


if __name__ == "__main__":
    main()
