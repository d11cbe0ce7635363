"""First-call warm-up of the fast engine in a fresh process, with cold, warm and shipped compile caches.

    PYTHONPATH=.:benchmarks python benchmarks/engine_warmup.py --out-dir $OUT [--variants parts compiled-decode]
    PYTHONPATH=.:benchmarks python benchmarks/engine_warmup.py --dry-run-cpu --out-dir /tmp/w   # checks the script

The question (issue 18, item 5): does a process whose torch.compile caches were filled by an earlier
process reach compiled-class speed after a short first call? For each variant, fresh Python processes
run one after another on one GPU, each with its own ``TORCHINDUCTOR_CACHE_DIR`` (and the GEMV tuner's
table of choices in it, ``HF_RSTITCH_TUNING_CACHE``; Triton's kernel cache is the machine's, or with
``--own-triton-cache`` one per sweep, empty for its cold process). ``--compile-threads 16 1`` runs the sweep
once per value of ``HF_RSTITCH_COMPILE_THREADS`` (kernels built ahead in parallel, or one after another):

* ``cold``: an empty cache directory -- the first-ever cost on a machine;
* ``warm``: the same directory again -- what every later process on that machine pays (inductor's
  FX-graph and AOTAutograd caches; dynamo still traces the model);
* ``mega``: an empty directory, but the artifacts the cold process saved with
  ``torch.compiler.save_cache_artifacts`` loaded first (``load_cache_artifacts``) -- a cache shipped
  to another machine of the same kind and versions.

Each process builds the random Qwen2 7B / 1.5B bf16 pair (``--pair``; not timed), then times: the first
``generate`` (batch 1, 128-token prompt, a 4-token stitched route: lanes built, GEMV kernels tuned,
steps compiled, decode and prompt graphs captured), ``FastLane.warm_up()`` of both lanes (every
other length bucket), then the LLM alone and the SLM alone through ``generate`` -- a decoded token as the
difference of a ``--new`` and a ``--new // 2`` token call (the prompt's prefill and the call's set-up cancel;
the floor ratio is of this), and the whole ``--new`` call per token -- and through a bare lane loop (no
policy, no per-token sync), then the first call at a
larger batch (``--then-batch``, 8: its graphs, and any compile a new batch size needs). Where the first call's
seconds went is a table of its own: each lane's build (kernels built ahead, the tuner, the steps' kernels built
ahead) and warm-up captures, the rest of the call, the tuner's timings, Triton's launcher builds, the answers
a shipped tuning table gave and the Triton cache entries the shipped kernels seeded (``--no-shipped``: neither;
``--profile-first-call TOP``: the last process of each sweep host-profiled too). A cold process is a fresh machine
with the package installed: its shipped assets in, every cache of its own empty. ``--pair`` takes another pair
of :data:`engine_shapes.SHAPES`. Floor: the bytes a decode step reads (weights) over the measured copy bandwidth.
With ``--profile``, the warm process also profiles ``--profile-steps`` decode graph replays of each model (kernels
grouped by family, as ``engine_profile.py``). Writes ``engine_warmup_<gpu>.json`` and ``.md``; prints one compact
JSON last.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

import lab
from engine_profile import summarize

VARIANTS = {"parts": dict(compile="parts"), "compiled-decode": dict(compile="decode"), "graphs": dict(),
            # what stitch_engine="auto" runs (hf_rstitch.fast.AUTO): parts, every graph captured when lanes are built
            "auto": dict(compile="parts", warm_up=True),
            # without the fused rotary / cache-store / gated-MLP kernels: what they buy
            "parts-unfused": dict(compile="parts", fuse_mlp=False, fuse_rope_store=False, fuse_add_norm=False),
            # without the residual adds fused with the norms after them (hf_rstitch.fast.patches.add_norm)
            "parts-add-norm-apart": dict(compile="parts", fuse_add_norm=False),
            # the adds and norms as compiled pieces at one row too, not folded into the products (fast.folds)
            "parts-no-folds": dict(compile="parts", folds=False)}


# ---- one child process ------------------------------------------------------------------------------------
def child(args) -> dict:
    import hf_rstitch  # noqa: F401  (patches generate)
    from engine_profile import decode_steps
    from engine_shapes import per_token
    from hf_rstitch import ReplayPolicy
    from hf_rstitch.core.roles import Role
    from hf_rstitch.fast import FastConfig, FastEngine
    from hf_rstitch.fast.patches import folds
    from hf_rstitch.fast.kernels import triton_support

    triton_compiles = listen_to_triton()
    phases = count_phases()
    start = time.perf_counter()
    if args.load_artifacts:
        torch.compiler.load_cache_artifacts(Path(args.load_artifacts).read_bytes())
    loaded_s = time.perf_counter() - start
    device = "cpu" if args.dry_run_cpu else "cuda"
    settings = dict(VARIANTS[args.variant])
    folds.ENABLED = settings.pop("folds", folds.ENABLED)
    cfg = FastConfig(**settings, **({"graphs": False, "max_bucket": 8} if args.dry_run_cpu else {}))
    llm, slm = models(args.pair, device, args.dry_run_cpu)
    for m in (llm, slm):
        m.generation_config.eos_token_id, m.generation_config.pad_token_id = None, 0
    bw = lab.copy_bandwidth(device)
    vocab = min(llm.config.vocab_size, slm.config.vocab_size)
    ids = lab.prompt_ids(vocab, args.prompt, device)
    engine = FastEngine(cfg, capacity=args.prompt + args.new + 8, max_batch=max(1, args.then_batch))

    def generate(roles, n, prompt=ids):
        return llm.generate(prompt, attention_mask=torch.ones_like(prompt), assistant_model=slm,
                            stitch_policy=ReplayPolicy(roles), stitch_engine=engine, max_new_tokens=n, do_sample=False)

    res = {"variant": args.variant, "mode": args.mode, "config": repr(cfg), "folds": folds.ENABLED, "load_artifacts_s": loaded_s,
           "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"), "bandwidth_gbps": bw}
    first = lambda: generate(["slm", "llm", "slm", "llm"], 4)  # noqa: E731
    if args.profile_first_call:  # host profile (slows the Python-heavy parts: for where, not how long)
        first, res["first_call_profile"] = lab.host_profiled(first, args.profile_first_call)
    res["first_call_s"], _ = lab.timed(first, device)
    res["first_call_profile"] = res.get("first_call_profile", lambda: None)()
    res["phases"] = first_call_phases(engine, phases, res["first_call_s"])
    graphs = engine.graph_count()
    # a second call whose route needs catch-ups the first did not (runs of 9 and 33 tokens): its seconds, and the
    # graphs it captured mid-way (none where the lanes were warmed up when built)
    route = ["slm"] * 9 + ["llm"] * 9 + ["slm"] * 33 + ["llm"] * 33
    res["new_route_call_s"], _ = lab.timed(lambda: generate(route, len(route)), device)
    res["new_route_captures"] = engine.graph_count() - graphs
    res["warm_up_every_bucket_s"] = sum(lane.warm_up() for lane in engine._lanes.values())
    res["gemv_tune_s"] = sum(lane.gemv_tune_seconds for lane in engine._lanes.values())
    res["graphs"] = engine.graph_count()
    res["triton_compiles"] = dict(triton_compiles)  # this process's, up to here (inductor's run in its workers)
    res["compile_threads"] = triton_support.COMPILE_THREADS
    if args.save_artifacts:
        saved = torch.compiler.save_cache_artifacts()
        if saved is not None:
            Path(args.save_artifacts).write_bytes(saved[0])
            res["artifact_bytes"] = len(saved[0])
    from torch._dynamo.utils import counters
    res["cache_counters"] = {f"{g}.{k}": v for g in ("inductor", "aot_autograd") for k, v in counters[g].items()
                             if "cache" in k}
    res["dynamo_graphs"] = counters["stats"]["unique_graphs"]  # pieces torch.compile traced (0: none, regions.KERNELS)
    for tag, model, role in (("llm", llm, Role.LLM), ("slm", slm, Role.SLM)):
        replayed = lambda roles, n, policy: lambda: generate(roles, n)  # noqa: E731 - the call, to time; replayed
        t = per_token(tag, model, replayed, args, device, bw, "replay")  # a token's decode: prompt, set-up cancel
        lane = engine._lanes[role]
        lane.reset()
        bare = 1e3 * decode_steps(lane, ids, args.new // 2, lambda: lab.sync(device))
        res[tag] = {"floor_ms": t["floor_ms"], "generate_ms_per_token": t["call_ms_per_token"],
                    "call_x_floor": t["call_ms_per_token"] / t["floor_ms"],
                    "generate_decode_ms_per_token": t["ms_per_token"], "x_floor": t["ms_per_token"] / t["floor_ms"],
                    "bare_lane_ms_per_token": bare, "bare_x_floor": bare / t["floor_ms"]}
        if args.profile:
            lane.reset()
            res[tag]["profile"] = profile_replays(lane, ids, args.profile_steps, device, decode_steps)
    if args.then_batch > 1:  # a first call at a larger batch: new graphs, and with compile="decode" new compiles
        rows = ((ids + torch.arange(args.then_batch, device=ids.device)[:, None]) % vocab).contiguous()
        res["then_batch"] = args.then_batch
        res["first_batch_call_s"], _ = lab.timed(lambda: generate([["slm", "llm", "slm", "llm"]] * len(rows), 4,
                                                                  rows), device)
    return res


def models(pair: str, device: str, tiny: bool):
    """``(llm, slm)`` of ``pair`` ("LLM/SLM" names of :data:`engine_shapes.SHAPES`), random, bf16, seeded; the
    Qwen2 pair as :func:`lab.random_pair` makes it."""
    if pair == "qwen2-7b/qwen2-1.5b" or tiny:
        return lab.random_pair("tiny" if tiny else "qwen2", device)
    from engine_shapes import build

    big, small = pair.split("/")
    return build(big, device, seed=0), build(small, device, seed=1)


def count_phases() -> dict:
    """Tallies of what a first call does besides Triton's kernel builds (:func:`listen_to_triton`): the tuner's
    timings (``triton_support.graph_ms``: graphs of a candidate's launches) and Triton's launcher builds (its C
    compiler, ``triton.runtime.build._build``), each a count and host seconds."""
    from hf_rstitch.fast.kernels import triton_support

    tally = {"tuner_timings": [0, 0.0], "launcher_builds": [0, 0.0]}

    def counted(fn, name):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                tally[name][0] += 1
                tally[name][1] += time.perf_counter() - start
        return run

    triton_support.graph_ms = counted(triton_support.graph_ms, "tuner_timings")
    try:
        from triton.runtime import build
        build._build = counted(build._build, "launcher_builds")
    except (ImportError, AttributeError):
        pass
    return tally


def first_call_phases(engine, tally: dict, first_call_s: float) -> dict:
    """Where the first call's seconds went: each lane's build (kernels built ahead, the tuner, the rest of the
    lane) and warm-up (every graph captured), the rest of the call (prompts, decode steps); the tuner's timings,
    the launcher builds, the tuning table's answers from a shipped table."""
    from hf_rstitch.core.roles import Role
    from hf_rstitch.fast.kernels import triton_cache
    from hf_rstitch.fast.patches import products

    out = {tag: dict(getattr(lane, "build_seconds", {})) for tag, lane in
           (("slm", engine._lanes.get(Role.SLM)), ("llm", engine._lanes.get(Role.LLM))) if lane is not None}
    built = sum(p.get("lane", 0.0) + p.get("warm_up", 0.0) for p in out.values())
    out["rest_of_call_s"] = first_call_s - built
    out["captures_s"] = engine.capture_seconds()
    out["capture_warm_ups_s"] = sum(l.graphs.warm_seconds for l in engine._lanes.values() if l.graphs is not None)
    out["lean_captures"] = sum(getattr(l.graphs, "lean", 0) for l in engine._lanes.values() if l.graphs is not None)
    out["lean_failed"] = sum(getattr(l.graphs, "lean_failed", 0) for l in engine._lanes.values()
                             if l.graphs is not None)
    out["tuner_timings"], out["tuner_timing_s"] = tally["tuner_timings"]
    out["launcher_builds"], out["launcher_build_s"] = tally["launcher_builds"]
    out["from_shipped_table"] = getattr(products.TABLE, "from_shipped", 0)
    out["kernels_seeded"] = triton_cache.seeded()  # Triton cache entries from the shipped archive
    out["steps_marked"] = [str(lane.role) for lane in engine._lanes.values() if getattr(lane, "steps_marked", False)]
    out["steps_ahead_errors"] = [lane.ahead_error for lane in engine._lanes.values()
                                 if getattr(lane, "ahead_error", None)]
    return dict(out)


def listen_to_triton() -> dict:
    """Tallies of the Triton compiles this process runs: kernels built, loaded from Triton's disk cache, and the
    seconds each took (summed: parallel compiles overlap), per kernel name."""
    tally = {"built": 0, "from_disk": 0, "build_s": 0.0, "by_kernel": {}}
    try:
        from triton import knobs
    except ImportError:
        return tally

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        name = getattr(getattr(src, "fn", None), "__name__", "?")
        tally["from_disk" if cache_hit else "built"] += 1
        if not cache_hit:
            tally["build_s"] += times.total / 1e6
            built = tally["by_kernel"].setdefault(name, [0, 0.0])
            built[0] += 1
            built[1] += times.total / 1e6

    knobs.compilation.listener = listener
    return tally


def profile_replays(lane, ids, steps: int, device: str, decode_steps) -> dict:
    """Device kernels of ``steps`` one-token graph replays, per token, grouped by family."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        decode_steps(lane, ids, steps, lambda: lab.sync(device))
    n = steps + 1  # the prefill is in the profiled region too
    return summarize([e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA], n)


# ---- the parent: fresh processes one after another -------------------------------------------------------
def spawn(args, variant: str, mode: str, cache: Path, artifacts: Path, timeout: float, threads: int,
          profiled: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--child", "--variant", variant, "--mode", mode, "--prompt", str(args.prompt),
           "--new", str(args.new), "--profile-steps", str(args.profile_steps), "--then-batch", str(args.then_batch)]
    cmd += ["--dry-run-cpu"] if args.dry_run_cpu else []
    cmd += ["--pair", args.pair]
    cmd += ["--save-artifacts", str(artifacts)] if mode == "cold" else []
    cmd += ["--load-artifacts", str(artifacts)] if mode == "mega" else []
    cmd += ["--profile"] if args.profile and mode == "warm" else []
    cmd += ["--profile-first-call", str(args.profile_first_call)] if profiled else []
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache),  # and the GEMV tuner's choices beside it
           "HF_RSTITCH_TUNING_CACHE": str(cache / "gemv_tuning.json")}
    if threads:
        env["HF_RSTITCH_COMPILE_THREADS"] = str(threads)
    if args.no_shipped:  # every shape timed and every kernel built, as on a GPU kind the package ships nothing for
        env.update(HF_RSTITCH_SHIPPED_TUNING="off", HF_RSTITCH_SHIPPED_KERNELS="off")
    if args.own_triton_cache:  # cold: Triton's kernels built from nothing, even on a used machine
        env["TRITON_CACHE_DIR"] = str(cache / "triton")
    return {"variant": variant, "mode": mode, **lab.run_child(cmd, env, timeout), "threads": threads,
            "profiled": profiled}


def markdown(doc: dict) -> str:
    env = doc["environment"]
    llm, slm = doc["args"].get("pair", "qwen2-7b/qwen2-1.5b").split("/")
    shipped = ("no shipped tuning table or Triton kernels" if doc["args"].get("no_shipped")
               else "the shipped tuning table and Triton kernels read (cold: a fresh machine with the package "
                    "installed)")
    lines = [f"# Fast engine warm-up in a fresh process: random {llm} (LLM) / {slm} (SLM), bf16, "
             f"{', '.join(env['devices'])}", "",
             f"torch {env['torch']}, transformers {env['transformers']}, {env['date']}; batch 1, prompt "
             f"{doc['args']['prompt']} tokens, {doc['args']['new']} new tokens timed; {shipped}. cold: empty "
             "compile caches (the tuner's, inductor's, and Triton's with `--own-triton-cache`: a fresh machine); "
             "warm: the cache the cold process filled; mega: empty cache plus the cold process's "
             "`save_cache_artifacts` loaded first. ms/token: a decoded token through `generate` (the difference "
             f"of calls of {doc['args']['new']} and {doc['args']['new'] // 2} new tokens: the prompt's prefill and "
             "the call's set-up cancel; x floor is of this), then the whole call over its new tokens and the bare "
             "lane loop, in brackets.", "",
             "compile threads: the GEMV tuner's parallel Triton compiles (`HF_RSTITCH_COMPILE_THREADS`; 1: one "
             "after another). Tuning: seconds of the first call spent building kernels ahead (the tuner's "
             "candidates, the split attention's buckets) and timing the candidates. Triton kernels: built in this "
             "process (their build seconds summed, overlapping when parallel) / loaded from Triton's disk cache.", "",
             "| variant | compile threads | cache | first call (s) | tuning (s) | Triton kernels built (s) / "
             "loaded | new route: call s (captures) | every bucket (s) | 7B ms/token | x floor | 1.5B ms/token | "
             f"x floor | first call at B = {doc['args']['then_batch']} (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["runs"]:
        threads = r.get("compile_threads", r.get("threads"))
        if "error" in r:
            last = r["error"].strip().splitlines()[-1][:80] if r["error"].strip() else ""
            lines.append(f"| {r['variant']} | {threads} | {r['mode']} | error: {last} | | | | | | | | | |")
            continue
        cell = lambda t: (f"{r[t].get('generate_decode_ms_per_token', float('nan')):.2f} "  # noqa: E731
                          f"({r[t]['generate_ms_per_token']:.2f}, {r[t]['bare_lane_ms_per_token']:.2f})")
        batch = f"{r['first_batch_call_s']:.1f}" if "first_batch_call_s" in r else "-"
        tc = r.get("triton_compiles", {})
        kernels = f"{tc.get('built', 0)} ({tc.get('build_s', 0):.1f}) / {tc.get('from_disk', 0)}"
        lines.append(f"| {r['variant']} | {threads} | {mode_of(r)} | {r['first_call_s']:.1f} | "
                     f"{r['gemv_tune_s']:.1f} | {kernels} | {r.get('new_route_call_s', float('nan')):.2f} "
                     f"({r.get('new_route_captures', '-')}) | "
                     f"{r['warm_up_every_bucket_s']:.1f} | "
                     f"{cell('llm')} | {r['llm']['x_floor']:.2f} | {cell('slm')} | {r['slm']['x_floor']:.2f} | "
                     f"{batch} |")
    lines += phase_table(doc["runs"])
    for r in doc["runs"]:
        if r.get("first_call_profile"):
            for order, rows in r["first_call_profile"].items():
                lines += ["", f"Host profile of the {r['mode']} process's first call (cProfile: slows Python-heavy "
                          f"parts), by {order} seconds: cumulative | own | calls | function", ""]
                lines += [f"    {ct:8.3f} {tt:8.3f} {nc:7} {where}" for ct, tt, nc, where in rows]
    for r in doc["runs"]:
        for tag in ("llm", "slm"):
            p = r.get(tag, {}).get("profile")
            if p:
                fams = ", ".join(f"{k} {v['ms']:.2f} ms / {v['kernels']:.0f}" for k, v in
                                 sorted(p["by_family"].items(), key=lambda kv: -kv[1]["ms"]))
                lines.append(f"\nProfile, {r['variant']} {tag}: {p['kernels_per_token']:.0f} kernels, "
                             f"{p['kernel_ms_per_token']:.2f} ms of kernels per token ({fams}).")
    if doc["skipped"]:
        lines += ["", "Skipped: " + "; ".join(doc["skipped"])]
    return "\n".join(lines)


def mode_of(r: dict) -> str:
    return r["mode"] + (" (profiled)" if r.get("profiled") else "")


def phase_table(runs: list) -> list[str]:
    """Where each process's first call went (seconds): per lane its build -- kernels built ahead, the tuner
    (timing, table look-ups), the rest -- and warm-up (graphs captured); the rest of the call; the tuner's
    timings, Triton's launcher builds (count, seconds), the table's answers from a shipped table and the Triton
    cache entries seeded from the shipped kernels."""
    lines = ["", "Where the first call went (s): per lane, build: all of it, of which the products' kernels built "
             "ahead (ahead), the tuner (timing, table look-ups) and the steps' other kernels built ahead (steps); "
             "warm-up: every graph captured; captures: all of them (of which the real calls before each recording; "
             "graphs recorded without a real call first / such recordings that failed and were made again). "
             "Tuner timings and launcher builds: count (s).", "",
             "| cache | first call | SLM ahead | SLM tuner | SLM steps | SLM build | SLM warm-up | LLM ahead | "
             "LLM tuner | LLM steps | LLM build | LLM warm-up | rest of call | captures | tuner timings | "
             "launcher builds | from shipped table | shipped kernels seeded | steps' kernels known cached |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        p = r.get("phases")
        if not p:
            continue
        lane = lambda t: " | ".join(f"{p.get(t, {}).get(k, float('nan')):.2f}"  # noqa: E731
                                    for k in ("precompile", "tune", "steps_ahead", "lane", "warm_up"))
        lines.append(f"| {mode_of(r)} | {r['first_call_s']:.2f} | {lane('slm')} | {lane('llm')} | "
                     f"{p['rest_of_call_s']:.2f} | {p['captures_s']:.2f} "
                     f"({p.get('capture_warm_ups_s', float('nan')):.2f}; {p.get('lean_captures', '-')} / "
                     f"{p.get('lean_failed', '-')}) | "
                     f"{p['tuner_timings']} "
                     f"({p['tuner_timing_s']:.2f}) | {p['launcher_builds']} ({p['launcher_build_s']:.2f}) | "
                     f"{p['from_shipped_table']} | {p.get('kernels_seeded', '-')} | "
                     f"{', '.join(p.get('steps_marked', [])) or '-'} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=str(lab.RESULTS))
    ap.add_argument("--variants", nargs="+", default=["parts", "compiled-decode"], choices=list(VARIANTS))
    ap.add_argument("--modes", nargs="+", default=["cold", "warm", "mega"], choices=["cold", "warm", "mega"])
    ap.add_argument("--pair", default="qwen2-7b/qwen2-1.5b", help="LLM/SLM, names of engine_shapes.SHAPES")
    ap.add_argument("--no-shipped", action="store_true", help="children ignore the shipped tuning tables and "
                                                               "Triton kernels (HF_RSTITCH_SHIPPED_TUNING=off, "
                                                               "HF_RSTITCH_SHIPPED_KERNELS=off)")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=512, help="new tokens per timed generate")
    ap.add_argument("--profile", action="store_true", help="profile decode replays in the warm process")
    ap.add_argument("--profile-steps", type=int, default=16)
    ap.add_argument("--profile-first-call", type=int, default=0, metavar="TOP",
                    help="host-profile the first call (cProfile) of the last process of each sweep (--modes cold "
                         "warm warm: a second warm one), keeping its TOP functions by cumulative and by own seconds "
                         "(0: no profile)")
    ap.add_argument("--then-batch", type=int, default=8, help="then time a first call at this batch size (0: none)")
    ap.add_argument("--compile-threads", nargs="+", type=int, default=[0],
                    help="HF_RSTITCH_COMPILE_THREADS of the child processes, one sweep of --modes each (0: the "
                         "library's default; 1: kernels compiled one after another)")
    ap.add_argument("--own-triton-cache", action="store_true",
                    help="each sweep its own Triton kernel cache (TRITON_CACHE_DIR), empty for its cold process; "
                         "default: the machine's")
    ap.add_argument("--tag", default="", help="results go to engine_warmup_<tag>_<gpu>.{json,md} (default: no tag)")
    ap.add_argument("--budget-s", type=float, default=540, help="no process starts past this many seconds")
    ap.add_argument("--cache-root", default=None, help="parent of the per-variant cache dirs (default: a temp dir)")
    ap.add_argument("--dry-run-cpu", action="store_true", help="tiny models on CPU: checks the script, times nothing")
    # child-only
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--variant", default="parts", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="cold", help=argparse.SUPPRESS)
    ap.add_argument("--save-artifacts", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--load-artifacts", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        with torch.no_grad():
            print(lab.CHILD_RESULT + json.dumps(child(args), default=str), flush=True)
        return
    root = Path(args.cache_root or tempfile.mkdtemp(prefix="rstitch_warmup_"))
    device = "cpu" if args.dry_run_cpu else "cuda"
    doc = {"environment": lab.environment([device]), "args": vars(args), "runs": [], "skipped": []}
    name = doc["environment"]["devices"][0] if device == "cuda" else "cpu dry run"
    gpu = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    stem = Path(args.out_dir) / ("engine_warmup_" + (f"{args.tag}_" if args.tag else "") + gpu)
    start = time.perf_counter()
    for variant, threads in ((v, t) for v in args.variants for t in args.compile_threads):
        sweep = f"{variant}-t{threads}"
        cache, artifacts = root / sweep, root / f"{sweep}.artifacts"
        for i, mode in enumerate(args.modes):
            left = args.budget_s - (time.perf_counter() - start)
            if left < 30:
                doc["skipped"].append(f"{variant} {mode} threads {threads}: time budget")
                continue
            run_cache = root / f"{sweep}-mega" if mode == "mega" else cache  # mega: an empty directory
            profiled = bool(args.profile_first_call) and i == len(args.modes) - 1
            doc["runs"].append(spawn(args, variant, mode, run_cache, artifacts, timeout=left, threads=threads,
                                     profiled=profiled))
            print(json.dumps(doc["runs"][-1], default=str)[:2000], flush=True)
            lab.write_result(stem, doc, markdown(doc))
    lab.write_result(stem, doc, markdown(doc))
    print(markdown(doc))
    print(json.dumps({"device": name, "runs": [{k: r.get(k) for k in ("variant", "threads", "mode", "first_call_s",
                                                                         "new_route_call_s", "new_route_captures",
                                                                         "dynamo_graphs", "phases")} |
                                               {t: r.get(t, {}).get("generate_decode_ms_per_token") for t in ("llm", "slm")}
                                               for r in doc["runs"]]}))


if __name__ == "__main__":
    main()
