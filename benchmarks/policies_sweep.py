"""Routing policies side by side on the shipped toy pair: R-Stitch (token entropy), step-level routing
(GlimpRouter), R2R's neural router, the shipped R-Stitch+ router, random routing, and each model alone.

Two splits: the shipped pair's 600 test problems (``test``) and a harder held-out split (``hard``): level-3
problems (four operations, larger numbers) of the toy world's test split drawn from another seed (49), so
none is one of the 600. Per method and setting: accuracy, mean new tokens, LLM-token share, the latency
model's estimate (paper Eq. 4) on the GPU the shipped profile was measured on (H200,
``hf_rstitch/assets/router/latency.json``) and its speed-up over the LLM alone, and CPU wall time at batch
size 1 on the first ``--timed`` problems of the split.

Accuracy and tokens come from :func:`hf_rstitch.eval.sweep` (greedy, left-padded batches through
``generate``); batch size does not change a greedy route (rows equal their solo runs). Each finished
(split, method) row is appended to ``OUT.progress.jsonl`` at once, so a long run can be read (and resumed)
while it goes; the tables and the Pareto plot are written from it at the end (``--report-only`` redoes them).

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/policies_sweep.py --r2r runs/r2r_toy/router.pt
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lab import RESULTS, device_name, environment, write_result  # noqa: E402

RSTITCH = [0.001, 0.005, 0.02, 0.1]
STEP = [0.001, 0.005, 0.02, 0.1]
RANDOM = [0.1, 0.3, 0.5, 0.8]
ROUTER = [0.001, 0.005, 0.02, 0.1]
R2R = [0.3, 0.5, 0.75, 0.9]
SPECULATE = [0.005, 0.02]  # R-Stitch thresholds run again with speculative verification (same tokens as R-Stitch)
SPEC_K = 4  # SLM drafts per LLM verification


def splits(n_test: int, n_hard: int) -> dict[str, list[dict]]:
    from hf_rstitch.resources import shipped
    from hf_rstitch.toyworld.tasks import iter_rows, read_jsonl

    test = read_jsonl(Path(shipped("llm")).parent / "test.jsonl")[:n_test]
    seen = {r["problem"] for r in test}
    hard = []
    for row in iter_rows("test", seed=49):
        if row["level"] == 3 and row["problem"] not in seen:
            hard.append(row)
            seen.add(row["problem"])
        if len(hard) == n_hard:
            break
    return {"test": test, "hard": hard}


def methods(llm, slm, tok, settings, r2r: str | None, speculate=tuple(SPECULATE)) -> list:
    from hf_rstitch.eval.methods import build_methods

    kinds = ["llm", "slm", "rstitch", "step", "random", "router"] + (["r2r"] if r2r else [])
    built = build_methods(kinds, llm, slm, settings, thresholds=RSTITCH, random_p=RANDOM, step_thresholds=STEP,
                          step_delimiter=".", tokenizer=tok, r2r_router=r2r, r2r_thresholds=R2R, router="shipped")
    built += build_methods(["speculate"], llm, slm, settings, thresholds=list(speculate), speculate_k=SPEC_K)
    routers = [m for m in built if m.kind == "router"]
    if routers:  # one R-Stitch+ method per threshold
        from hf_rstitch.eval.methods import LearnedRouter

        built = [m for m in built if m.kind != "router"] + [
            LearnedRouter(llm, slm, settings, routers[0].router, t) for t in ROUTER]
    return built


ROUND_ORDER = [1, 3, 0, 2]  # settings of a kind, by index: the middle-low one first, then the spread


def in_rounds(built: list) -> list:
    """Methods in rounds: each round runs one more setting of every kind (kinds in priority order), so a
    run stopped by ``--stop-at`` leaves every kind with a spread of settings rather than some kinds with none."""
    priority = ["slm", "rstitch", "router", "step", "speculate", "random", "r2r", "llm"]
    by_kind: dict[str, list] = {}
    for m in built:
        by_kind.setdefault(m.kind, []).append(m)
    for kind, ms in by_kind.items():
        ms.sort(key=lambda m: m.param if m.param is not None else 0)
        ranks = {i: r for r, i in enumerate(ROUND_ORDER)}
        by_kind[kind] = sorted(ms, key=lambda m, ms=ms: ranks.get(ms.index(m), len(ranks) + ms.index(m)))
    kinds = sorted(by_kind, key=lambda k: priority.index(k) if k in priority else len(priority))
    depth = max((len(v) for v in by_kind.values()), default=0)
    return [by_kind[k][i] for i in range(depth) for k in kinds if i < len(by_kind[k])]


def _stop_time(text: str | None) -> float | None:
    """``HH:MM`` (UTC, today) as epoch seconds: no (split, method) row starts after it."""
    if not text:
        return None
    import datetime as dt

    now = dt.datetime.now(dt.timezone.utc)
    hh, mm = (int(x) for x in text.split(":"))
    return now.replace(hour=hh, minute=mm, second=0, microsecond=0).timestamp()


def timed_b1(method, problems, tok, n: int) -> float:
    """Mean CPU seconds per problem at batch size 1 over the first ``n`` problems."""
    import torch

    from hf_rstitch.eval.data import prompt_ids

    times = []
    for p in problems[:n]:
        ids = torch.tensor([prompt_ids(tok, p["problem"], "", True)])
        t0 = time.perf_counter()
        method.run(ids)
        times.append(time.perf_counter() - t0)
    return statistics.fmean(times) if times else float("nan")


def run(args) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_rstitch.eval import sweep
    from hf_rstitch.eval.methods import GenSettings
    from hf_rstitch.latency import LatencyModel
    from hf_rstitch.resources import shipped

    torch.set_num_threads(1)
    llm = AutoModelForCausalLM.from_pretrained(shipped("llm")).eval()
    slm = AutoModelForCausalLM.from_pretrained(shipped("slm")).eval()
    tok = AutoTokenizer.from_pretrained(shipped("llm"))
    latency = LatencyModel.load(Path(shipped("router")) / "latency.json")
    settings = GenSettings(max_new_tokens=args.max_new_tokens)
    progress = Path(f"{args.out}.progress.jsonl")
    progress.parent.mkdir(parents=True, exist_ok=True)
    shard, shards = (int(x) for x in args.shard.split("/"))
    rows = _rows(progress)  # a row is done when run in this shard, or whole, or in every part of another sharding
    done = {(r["split"], r["method"]) for r in rows if r.get("shard", "0/1") == args.shard}
    done |= {(r["split"], r["method"]) for r in merge_shards(rows)}
    stop = _stop_time(args.stop_at)
    for split, problems in splits(args.n_test, args.n_hard).items():
        if args.splits and split not in args.splits:
            continue
        problems = problems[shard::shards]
        for m in in_rounds(methods(llm, slm, tok, settings, args.r2r, args.speculate)):
            if (split, m.name) in done or (args.only and m.kind not in args.only):
                continue
            if stop is not None and time.time() > stop:
                print(f"--stop-at {args.stop_at} reached: {split} {m.name} and later settings not run", flush=True)
                return
            t0 = time.perf_counter()
            row = sweep(llm, slm, tok, problems, methods=[m], settings=settings, batch_size=args.batch_size,
                        latency_model=latency)[0]
            row.update(split=split, label=m.label, sweep_s=time.perf_counter() - t0,
                       prompt_tokens=mean_prompt(tok, problems), shard=args.shard)
            if args.batch_size == 1:  # the sweep's own calls are batch size 1: every problem is timed
                row.update(cpu_b1_s=row["wall_s"] / row["n"], timed_n=row["n"])
            else:
                row.update(cpu_b1_s=timed_b1(m, problems, tok, args.timed), timed_n=min(args.timed, len(problems)))
            if m.kind == "slm":
                row["latency_ms"] = _slm_alone_ms(latency, row)
            with progress.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(f"{split:5s} {m.name:24s} acc {row['accuracy']:.3f} llm {row['llm_token_share']:.3f} "
                  f"L {row.get('latency_ms', float('nan')):.1f} ms  b1 {row['cpu_b1_s']:.2f} s  ({row['sweep_s']:.0f} s)",
                  flush=True)


def _slm_alone_ms(latency, row, role: str = "slm") -> float:
    """One model writing the mean number of tokens after the mean prompt (its profile, the LLM-alone formula)."""
    n, prompt = int(row["new_tokens"]), round(row.get("prompt_tokens", 40))
    calls = [{"role": role, "n_inf": prompt, "n_kv": 0}] + [
        {"role": role, "n_inf": 1, "n_kv": prompt + i} for i in range(n - 1)]
    return latency.predict_trace({"calls": calls, "roles": [role] * n})


def mean_prompt(tok, problems) -> float:
    """Mean prompt length in tokens (as the harness prompts the toy pair: chat template, no instruction)."""
    from hf_rstitch.eval.data import prompt_ids

    return statistics.fmean(len(prompt_ids(tok, p["problem"], "", True)) for p in problems)


def reference_llm(path: str) -> dict:
    """The LLM-alone row of the test split from an earlier ``rstitch eval`` of the same pair on the same 600
    problems (its ``summary.json``), for a sweep that had no time to run it: accuracy and mean tokens as that run
    measured them, the latency estimate from its mean length (as the SLM's), its CPU seconds as measured there."""
    from transformers import AutoTokenizer

    from hf_rstitch.latency import LatencyModel
    from hf_rstitch.resources import shipped

    doc = json.loads(Path(path).read_text())
    tok = AutoTokenizer.from_pretrained(shipped("llm"))
    llm = doc["results"]["test"]["llm"]
    latency = LatencyModel.load(Path(shipped("router")) / "latency.json")
    row = {"method": "llm", "kind": "llm", "param": None, "n": llm["n"], "accuracy": llm["acc"] / 100,
           "new_tokens": llm["total_tokens"], "llm_tokens": llm["llm_tokens"], "slm_tokens": 0.0, "switches": 0.0,
           "llm_token_share": 1.0, "split": "test", "cpu_b1_s": float("nan"), "reference_cpu_b1_s": llm["latency_s"],
           "label": f"LLM (from {Path(path).parent.name}: max {doc['settings']['max_new_tokens']} new tokens)",
           "reference": path, "prompt_tokens": mean_prompt(tok, splits(llm["n"], 0)["test"])}
    row["latency_ms"] = _slm_alone_ms(latency, row, "llm")
    return row


MEANS = ("accuracy", "new_tokens", "llm_tokens", "slm_tokens", "switches", "latency_ms", "llm_forward_calls",
         "prompt_tokens")


def merge_shards(rows: list[dict]) -> list[dict]:
    """One row per (split, method), the latest: a row run whole, or the rows of its ``--shard i/n`` parts merged
    (n-weighted means, summed seconds) where every part finished; methods with parts missing are left out."""
    latest: dict[tuple, dict] = {}
    for r in rows:
        latest[(r["split"], r["method"], r.get("shard", "0/1"))] = r
    merged: dict[tuple, dict] = {}
    for (split, name, part), r in latest.items():
        if part == "0/1":
            merged[(split, name)] = r
    for split, name in {(k[0], k[1]) for k, r in latest.items() if k[2] != "0/1"} - set(merged):
        parts = [r for k, r in latest.items() if k[:2] == (split, name) and k[2] != "0/1"]
        if len(parts) != int(parts[0]["shard"].split("/")[1]):
            continue
        n = sum(r["n"] for r in parts)
        row = {**parts[0], "n": n, "shard": f"{len(parts)} parts"}
        for key in MEANS:
            if all(key in r for r in parts):
                row[key] = sum(r[key] * r["n"] for r in parts) / n
        for key in ("wall_s", "sweep_s"):
            row[key] = sum(r[key] for r in parts)
        row["llm_token_share"] = row["llm_tokens"] / max(row["new_tokens"], 1e-9)
        row["cpu_b1_s"], row["timed_n"] = row["wall_s"] / n, n
        merged[(split, name)] = row
    return list(merged.values())


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def report(args) -> None:
    rows = merge_shards(_rows(Path(f"{args.out}.progress.jsonl")))
    if args.llm_reference and not any(r["split"] == "test" and r["kind"] == "llm" for r in rows):
        rows.append(reference_llm(args.llm_reference))
    order = ["llm", "slm", "rstitch", "speculate", "step", "r2r", "router", "random"]
    rows.sort(key=lambda r: (order.index(r["kind"]) if r["kind"] in order else 99, r["param"] or 0))
    for split in {r["split"] for r in rows}:
        llm = next((r for r in rows if r["split"] == split and r["kind"] == "llm"), None)
        for r in rows:
            if r["split"] == split and llm and r.get("latency_ms"):
                r["speedup"] = llm["latency_ms"] / r["latency_ms"]
    lines = [f"Shipped toy pair, greedy, max {args.max_new_tokens} new tokens. Latency: Eq. 4 with the shipped H200 "
             "profile (estimate, not measured here); speed-up over the LLM alone. LLM forwards: mean LLM forward calls "
             "per problem (fewer than its tokens only with speculation). CPU B=1: mean wall seconds per problem at "
             f"batch size 1 ({device_name('cpu')}, 1 thread a process, shared machine: the load changed during the run, "
             "so these seconds compare only roughly; the estimate is the comparison).", ""]
    if args.note:
        lines += [args.note, ""]
    for split in ("test", "hard"):
        part = [r for r in rows if r["split"] == split]
        if not part:
            continue
        lines += [f"### {split} (n = {part[0]['n']})", "",
                  "| method | accuracy | new tokens | LLM share | LLM forwards | switches | est. GPU ms | est. speed-up "
                  "| CPU B=1 s |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in part:
            label = f"{r['label']} τ={r['param']:g}" if r["kind"] == "router" else r["label"]
            lines.append(f"| {label} | {100 * r['accuracy']:.1f} | {r['new_tokens']:.1f} | "
                         f"{r['llm_token_share']:.3f} | {_cell(_llm_forwards(r))} | {r['switches']:.1f} | {r.get('latency_ms', float('nan')):.1f} | "
                         f"{r.get('speedup', float('nan')):.2f}x | {_cell(r['cpu_b1_s'], '.2f')} |")
        lines.append("")
    if args.produced_by:
        lines += ["Rows produced by: " + "; ".join(f"`{c}`" for c in args.produced_by), ""]
    doc = {"environment": environment(), "device_cpu": device_name("cpu"), "rows": rows,
           "produced_by": args.produced_by,
           "latency_profile": "hf_rstitch/assets/router/latency.json (NVIDIA H200)"}
    write_result(args.out, doc, "\n".join(lines))
    plot(rows, Path(f"{args.out}.png"))


def _cell(value: float, spec: str = ".1f") -> str:
    return "–" if value != value else format(value, spec)  # NaN: not measured


def _llm_forwards(row: dict) -> float:
    """Mean LLM forward calls per problem: the trace's count, else one a token for the LLM alone, none for the SLM."""
    if "llm_forward_calls" in row:
        return row["llm_forward_calls"]
    return {"llm": row["new_tokens"], "slm": 0.0}.get(row["kind"], float("nan"))


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits_here = [s for s in ("test", "hard") if any(r["split"] == s for r in rows)]
    fig, axes = plt.subplots(1, len(splits_here), figsize=(6.5 * len(splits_here), 4.8), squeeze=False)
    styles = {"rstitch": "o-", "speculate": "v:", "step": "s-", "r2r": "^-", "router": "D-", "random": "x--",
              "llm": "*", "slm": "P"}
    for ax, split in zip(axes[0], splits_here):
        for kind, style in styles.items():
            pts = sorted((r["speedup"], 100 * r["accuracy"]) for r in rows
                         if r["split"] == split and r["kind"] == kind and "speedup" in r)
            if pts:
                ax.plot(*zip(*pts), style, label={"rstitch": "R-Stitch", "step": "Step (GlimpRouter)", "r2r": "R2R",
                                                  "router": "R-Stitch+", "random": "Random", "llm": "LLM",
                                                  "speculate": f"R-Stitch + speculation (k={SPEC_K})",
                                                  "slm": "SLM"}[kind], markersize=7)
        ax.set_xlabel("estimated speed-up over the LLM (Eq. 4, H200 profile)")
        ax.set_ylabel("accuracy (%)")
        ax.set_title(f"toy pair, {split} split")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-test", type=int, default=600)
    ap.add_argument("--n-hard", type=int, default=200)
    ap.add_argument("--timed", type=int, default=20, help="problems per split timed at batch size 1 on the CPU")
    ap.add_argument("--batch-size", type=int, default=50)
    ap.add_argument("--max-new-tokens", type=int, default=640)
    ap.add_argument("--r2r", default=None, help="an R2R router checkpoint for the pair (benchmarks/r2r_toy_router.py)")
    ap.add_argument("--only", nargs="*", default=None, help="run only these method kinds")
    ap.add_argument("--splits", nargs="*", default=None, help="run only these splits (test, hard)")
    ap.add_argument("--out", default=str(RESULTS / "policies_cpu"))
    ap.add_argument("--speculate", nargs="*", type=float, default=SPECULATE,
                    help="R-Stitch thresholds run again with speculative verification (k = SPEC_K)")
    ap.add_argument("--shard", default="0/1", help="i/n: run only problems i, i+n, ... of each split (n processes "
                    "share a sweep; the report merges a method's n parts once all have finished)")
    ap.add_argument("--stop-at", default=None, help="UTC HH:MM after which no further (split, method) row starts")
    ap.add_argument("--llm-reference", default=None, help="an eval summary.json of the same pair and test problems "
                    "whose LLM row stands in for the test split's LLM alone where this sweep did not run it")
    ap.add_argument("--note", default="", help="a paragraph for the tables' header (what was left out and why)")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--produced-by", nargs="*", default=[], help="the commands that made the rows (for --report-only)")
    args = ap.parse_args()
    if not args.report_only:
        run(args)
    report(args)


if __name__ == "__main__":
    main()
