"""The request engine alone under serving load, one variant of its join settings against another.

    PYTHONPATH=$PWD:$PWD/benchmarks python benchmarks/engine_variants.py --out-dir $OUT --levels 64 256 \\
        --variants default join_wait=0 prefill_chunk=512 --budget-s 540   # one GPU call
    PYTHONPATH=$PWD:$PWD/benchmarks python benchmarks/engine_variants.py --dry-run-cpu --out-dir /tmp/ev  # checks it

What ``serve_reasoning.py`` measures as "the engine alone" (its closed loop on the same MATH-shaped requests,
replayed routes with the decisions on the device, :func:`serve_alone.engine_closed_loop`, the phase profile in the
second half of each warm-up), for several engine settings: a variant is ``default`` or ``KEY=VALUE[,KEY=VALUE]``
of ``RequestEngine.of``'s ``join_wait``, ``join_group`` and ``prefill_chunk``, ``join_ahead=0`` (requests join at a
step's start, after the step before has been read: ``Executor.join_ahead`` None), or of a
:class:`~hf_rstitch.fast.FastConfig` field (``fast.compact_rows=true``). Each variant and method runs in a process
of its own, which builds the pair and its engine (``rstitch serve``'s ``auto``, as the server does), warms it up,
and runs each level. The question it
answers: which join setting serves best -- tokens/s, first tokens and p99, and where the step's time goes (joins,
other host work, steps that ran ahead) -- before one becomes ``rstitch serve``'s default.

Writes ``engine_variants_<gpu><tag>.{json,md,png}`` (``rows``: ``{"variant", "method", "concurrency", "engine"
(fast, or default where the fast engine fell back), "tokens_per_s",
"requests_per_s", "steps_per_s", "ttft_p50_s", "p50_s", "p99_s", "joins_share", "joins_per_step", "other_share",
"ahead_share", "after_read_share"}``; ``failed``: the variants and methods whose process failed or found no time left, and why),
after each variant (a run cut short keeps what it measured); exits 1 where a process failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lab  # noqa: E402
import serve_alone  # noqa: E402
import serve_reasoning as sr  # noqa: E402

ENGINE_KEYS = ("join_wait", "join_group", "prefill_chunk", "join_ahead", "after_read")  # join_ahead=0: joins at a
# step's start; after_read=0: where nothing ran ahead, the next call waits for the next step (Executor.after_read)


def parse_variant(text: str) -> tuple[dict, dict]:
    """``"default"`` or ``"join_wait=4,fast.compact_rows=true"`` as (RequestEngine.of fields, FastConfig fields)."""
    if text == "default":
        return {}, {}
    engine, fast = {}, []
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if key.startswith("fast."):
            fast.append(f"{key[5:]}={value}")
        elif sep and key in ENGINE_KEYS and value.lstrip("-").isdigit():
            engine[key] = int(value)
        else:
            raise SystemExit(f"--variants {text!r}: {part!r} is not KEY=VALUE with KEY one of {', '.join(ENGINE_KEYS)} "
                             "(an integer) or fast.<FastConfig field>")
    return engine, sr.fast_fields(fast)


def measure(args, variant: str, method: str, shape: dict, pair: tuple, budget) -> list[dict]:
    """One variant and method at each level that fits the budget: its rows."""
    engine_kw, fast = parse_variant(variant)
    cfg = sr.alone_cfg(method, shape, "tiny" if args.dry_run_cpu else "qwen2", args.device, args.dtype, args.engine,
                       max(args.levels), fast=fast,
                       join={k: v for k, v in engine_kw.items() if k not in ("prefill_chunk", "join_ahead", "after_read")},
                       prefill_chunk=engine_kw.get("prefill_chunk"))
    t0 = time.monotonic()
    engine = sr.build_engine(cfg, *pair)
    if engine_kw.get("join_ahead") == 0:  # the step before a join reads its values first, then the joins run
        engine.executor.join_ahead = None
    if engine_kw.get("after_read") == 0:  # where nothing ran ahead, the next call waits for the next step
        engine.executor.after_read = False
    warm_s = sr.warm(engine, cfg)
    mem = memory_gib(args)
    print(f"[{variant} {method}] built and warmed in {time.monotonic() - t0:.1f} s{_memory(mem)}", file=sys.stderr,
          flush=True)
    ps, rows = sr.prompts(len(shape[method]), shape["prompt"]), []
    for c in args.levels:
        if not budget.allows(args.warmup_s + args.window_s + 5):
            print(f"[{variant} {method} c={c}] skipped: {budget.left():.0f} s left", file=sys.stderr, flush=True)
            continue
        r = serve_alone.engine_closed_loop(engine, cfg, ps, c, args.warmup_s, args.window_s)
        p = r.get("phases") or {}
        rows.append({"variant": variant, "method": method, "concurrency": c, "engine": engine.engine.kind,
                     "tokens_per_s": r["tokens_per_s"],
                     "requests_per_s": r["requests_per_s"], "steps_per_s": r["steps_per_s"],
                     "ttft_p50_s": r["ttft_p50_s"], "p50_s": r["p50_s"], "p99_s": r["p99_s"],
                     "joins_share": p.get("joins", {}).get("share"),
                     "joins_per_step": p.get("joins", {}).get("joins_per_step"),
                     "other_share": p.get("other", {}).get("share"), "ahead_share": p.get("ahead_share"),
                     "after_read_share": p.get("after_read_share"),
                     "step_ms": p.get("step_ms"), "errors": r["errors"], "warm_up_s": warm_s, "memory_gib": mem,
                     "phases": p,
                     "lanes": lane_counts(engine)})
        print(f"[{variant} {method} c={c}] {json.dumps({k: v for k, v in rows[-1].items() if k != 'phases'})}",
              file=sys.stderr, flush=True)
    return rows


def lane_counts(engine) -> dict:
    """Per fast lane, since the engine was built (warm-ups and earlier levels included): the join twin's groups, and
    the calls that carried joiners as virtual rows with the rows they carried (``FastConfig(virtual_joins=...)``), and
    why kept joiners took the twin instead (its batches by the verb that forced them)."""
    out = {}
    for role, lane in (getattr(engine, "lanes", None) or {}).items():
        virtual = getattr(lane, "virtual", None)  # eager lanes have neither
        out[role.value] = {"join_groups": getattr(lane, "join_groups", None),
                           "virtual_calls": virtual.calls if virtual else None,
                           "virtual_rows": virtual.rows if virtual else None,
                           "twin_flushes": dict(virtual.flushes) if virtual else None}
    return out


def memory_gib(args) -> dict | None:
    """``{"allocated", "reserved"}`` GiB on CUDA once built and warmed (the engine's pools, graphs and the pair)."""
    if not args.device.startswith("cuda"):
        return None
    import torch

    return {"allocated": round(torch.cuda.memory_allocated() / 2**30, 2),
            "reserved": round(torch.cuda.memory_reserved() / 2**30, 2)}


def _memory(mem: dict | None) -> str:
    """``": N GiB allocated, M reserved"`` of :func:`memory_gib`, else empty."""
    return f": {mem['allocated']:.1f} GiB allocated, {mem['reserved']:.1f} reserved" if mem else ""


def pair_cfg(args) -> dict:
    return {"pair": "tiny" if args.dry_run_cpu else "qwen2", "device": args.device, "dtype": args.dtype}


def child(fields: dict, variant: str, method: str, deadline: float, out_file: str) -> None:
    """One variant and method in a process of its own (:func:`measure`, its pair built here): its rows to
    ``out_file``. Each build then finds the GPU as a fresh server does, whatever the process before it kept (its
    caching allocator's blocks, its graphs' pools; once, a collector freeze that never ended: 99.8 GiB of a dropped
    engine kept, and the next build at MATH's lengths ran out of memory and fell back to the eager engine)."""
    budget = lab.Budget(deadline - time.time())  # the run's deadline (wall clock): this process's start counts too
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    args = argparse.Namespace(**fields)
    rows = measure(args, variant, method, sr.shapes(args.scale), sr.build_pair(pair_cfg(args)), budget)
    Path(out_file).write_text(json.dumps(rows))


def in_child(args, variant: str, method: str, budget) -> tuple[list[dict], str | None]:
    """:func:`child` in a spawned process, waited for: ``(rows, None)``, or ``([], why)`` where it failed or the
    budget leaves no room for a level (said on stderr too)."""
    import tempfile

    if not budget.allows(args.warmup_s + args.window_s + 5):
        why = f"skipped: {budget.left():.0f} s left"
    else:
        with tempfile.TemporaryDirectory() as tmp:
            out_file = Path(tmp) / "rows.json"
            code = lab.in_own_process(child, vars(args), variant, method, time.time() + budget.left(), str(out_file))
            if code == 0 and out_file.exists():
                return json.loads(out_file.read_text()), None
            why = f"failed: its process exited with code {code} (its traceback is on stderr)"
    print(f"[{variant} {method}] {why}", file=sys.stderr, flush=True)
    return [], why


def markdown(doc: dict) -> str:
    def f(x, spec):
        return "-" if x is None else format(x, spec)

    lines = [f"# The request engine alone, join settings compared: {doc['gpu']}", "",
             f"{doc['pair']}; MATH-shaped requests scaled by {doc['scale']} (LLM alone ~{doc['mean_tokens']['llm_only']:.0f} "
             f"tokens a request, stitched ~{doc['mean_tokens']['stitched']:.0f}), replayed routes with decisions on the "
             f"device; closed loop of the engine alone (no HTTP), {doc['warmup_s']} s warm-up then a {doc['window_s']} s "
             "window a level; shares of a step from the phase profile (second half of the warm-up): joins (admission, "
             "the joining rows' prefill and chunks), other (host work the device did not overlap, and idle), steps "
             "whose next call ran ahead.", "",
             "| variant | method | clients | tokens/s | vs default | steps/s | TTFT p50 (s) | p50 (s) | p99 (s) | joins "
             "share, joins a step | other share | steps run ahead |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    base = {(r["method"], r["concurrency"]): r["tokens_per_s"] for r in doc["rows"] if r["variant"] == "default"}
    for r in doc["rows"]:
        b = base.get((r["method"], r["concurrency"]))
        vs = f"{r['tokens_per_s'] / b:.2f}x" if b else "-"
        method = r["method"] if r.get("engine", "fast") == "fast" else f"{r['method']} (eager engine)"
        lines.append(f"| {r['variant']} | {method} | {r['concurrency']} | {r['tokens_per_s']:.0f} | {vs} | "
                     f"{r['steps_per_s']:.1f} | {f(r['ttft_p50_s'], '.3f')} | {f(r['p50_s'], '.2f')} | "
                     f"{f(r['p99_s'], '.2f')} | {f(r['joins_share'], '.0%')}, {f(r['joins_per_step'], '.2f')} | "
                     f"{f(r['other_share'], '.0%')} | {f(r['ahead_share'], '.0%')}{_after(r)} |")
    lines += _virtual_lines(doc["rows"])
    lines += [f"\n{f['variant']} {f['method']}: {f['why']}" for f in doc.get("failed", [])]
    return "\n".join(lines) + "\n"


def _virtual_lines(rows: list[dict]) -> list[str]:
    """Where a variant's lanes read joiners as virtual rows: its calls that carried them and the rows carried, per
    lane, over the engine's life up to each level (from ``lane_counts``), beside the join twin's groups."""
    out = []
    for r in rows:
        lanes = {k: v for k, v in (r.get("lanes") or {}).items() if v.get("virtual_calls")}
        if lanes:
            out.append(f"- {r['variant']} {r['method']} at {r['concurrency']}: " + "; ".join(
                f"{k} lane {v['virtual_calls']} calls with {v['virtual_rows']} virtual rows, {v['join_groups']} twin "
                f"groups{_flushes(v)}" for k, v in lanes.items()))
    return ["", "Joins read as virtual rows (each engine's life up to the level):", *out] if out else []


def _flushes(lane: dict) -> str:
    """`` (twin batches instead: 3 wide call, 1 hold)`` where kept joins took the twin."""
    why = lane.get("twin_flushes") or {}
    return f" (twin batches instead: {', '.join(f'{n} {k}' for k, n in sorted(why.items()))})" if why else ""


def _after(row: dict) -> str:
    """The steps whose next call was queued right after their values were read, where any."""
    share = row.get("after_read_share")
    return f" (+{share:.0%} after the read)" if share else ""


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = sorted({r["method"] for r in doc["rows"]})
    fig, axes = plt.subplots(1, len(methods), figsize=(5.5 * len(methods), 4), squeeze=False)
    for ax, method in zip(axes[0], methods):
        for variant in dict.fromkeys(r["variant"] for r in doc["rows"]):
            pts = sorted((r["concurrency"], r["tokens_per_s"]) for r in doc["rows"]
                         if r["variant"] == variant and r["method"] == method)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=variant)
        ax.set(title=f"{method}: the engine alone", xlabel="concurrent requests", ylabel="tokens/s", xscale="log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(doc["gpu"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--variants", nargs="+", default=["default", "join_wait=0", "prefill_chunk=512"],
                    help="default, or KEY=VALUE[,KEY=VALUE] of join_wait, join_group, prefill_chunk, "
                         "join_ahead=0, after_read=0, fast.<field>")
    ap.add_argument("--methods", nargs="+", default=list(sr.METHODS), choices=sr.METHODS)
    ap.add_argument("--levels", type=int, nargs="+", default=[64, 256], help="concurrencies")
    ap.add_argument("--scale", type=float, default=0.05, help="factor on every token count (serve_reasoning.py's)")
    ap.add_argument("--warmup-s", type=float, default=3.0)
    ap.add_argument("--window-s", type=float, default=6.0)
    ap.add_argument("--budget-s", type=float, default=540.0, help="the whole run; levels that would not fit are skipped")
    ap.add_argument("--engine", default="auto", choices=["auto", "fast", "default"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tag", default="", help="a suffix of the results' file names (e.g. _join_rows)")
    ap.add_argument("--dry-run-cpu", action="store_true", help="tiny pair on CPU, tiny counts: checks the whole path")
    args = ap.parse_args(argv)
    for v in args.variants:
        parse_variant(v)  # a bad variant fails now, before any model is built
    if args.dry_run_cpu:
        args.device, args.dtype, args.engine = "cpu", "float32", "default"
        args.scale, args.levels = min(args.scale, 0.01), [c for c in args.levels if c <= 4] or [4]
        args.warmup_s, args.window_s = min(args.warmup_s, 0.5), min(args.window_s, 1.0)
    budget, out = lab.Budget(args.budget_s), Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shape = sr.shapes(args.scale)
    gpu = lab.file_tag(args.device)
    doc = {**lab.environment([args.device]), "gpu": gpu,
           "pair": "tiny random Qwen2 pair (CPU dry run)" if args.dry_run_cpu else f"random Qwen2 7B / 1.5B, {args.dtype}",
           "scale": args.scale, "warmup_s": args.warmup_s, "window_s": args.window_s, "engine": args.engine,
           "mean_tokens": {m: sum(shape[m]) / len(shape[m]) for m in sr.METHODS}, "rows": [], "failed": []}
    stem = out / f"engine_variants_{gpu}{args.tag}"
    for variant in args.variants:
        for method in args.methods:
            rows, why = in_child(args, variant, method, budget)
            doc["rows"] += rows
            if why is not None:
                doc["failed"].append({"variant": variant, "method": method, "why": why})
        lab.write_result(stem, doc, markdown(doc))
        plot(doc, stem.with_suffix(".png"))
    print(markdown(doc))
    return 1 if any(f["why"].startswith("failed") for f in doc["failed"]) else 0


if __name__ == "__main__":
    sys.exit(main())
