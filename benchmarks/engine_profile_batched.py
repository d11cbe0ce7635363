"""Where a decode step of the fast engine spends its time (one GPU, any batch size, the 7B or the 1.5B).

    PYTHONPATH=.:benchmarks python benchmarks/engine_profile_batched.py --out-dir $OUT      # CUDA, ~2 min
    PYTHONPATH=.:benchmarks python benchmarks/engine_profile_batched.py --dry-run-cpu --out-dir /tmp/p
    # the split attention's two plans where they differ: a short context in a long cache
    PYTHONPATH=.:benchmarks python benchmarks/engine_profile_batched.py --out-dir $OUT --context 256 \
        --capacity 3072 --batches 8 32 64 --split-bases written capacity --name engine_split_basis
    # programmatic dependent launch of the Triton kernels, off and on, both models
    PYTHONPATH=.:benchmarks python benchmarks/engine_profile_batched.py --out-dir $OUT --models 1.5b 7b \
        --pdl off all --batches 1 8 64 --name engine_pdl

The MATH-shaped batched workload (benchmarks/engine_batched.py) runs the 7B alone at 1.4-1.6x its
floor at B >= 8, against ~1.2x for the bare lane at B = 1. This script says where the difference
goes: for each model (``--models``) and batch size it builds a lane (``FastConfig(compile="parts")``,
the CUDA default) for that many rows, prefills every row with ``--context`` tokens (the middle of
the workload's 2753-token generations), then times ``--steps`` one-token graph replays through a
bare loop (no policy, no host wait per step) and profiles as many more, grouping device kernels by
family and naming the costliest. Each combination of ``--pdl``, ``--split-bases`` and
``--attention-plans`` is a run. Floor per step: weight bytes plus the KV bytes the step reads, over
the measured copy bandwidth. Writes ``<name>_<gpu>.json`` and ``.md`` (``--name``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import engine_bench as eb
import lab
from attention_sweep import set_plan
from engine_profile import summarize
from hf_rstitch.core.roles import Role
from hf_rstitch.fast import FastConfig, FastLane, decode_attention, rope_store, triton_support


class Rows:
    """``B`` rows decoding greedily in one lane: a prefill, then one-token steps."""

    def __init__(self, lane: FastLane, ids: torch.Tensor, room: int):
        b, self.t = ids.shape
        self.lane, self.rows, self.resumed = lane, torch.ones(b, dtype=torch.bool), torch.zeros(b, dtype=torch.bool)
        self.buf = torch.cat([ids, ids.new_zeros(b, room)], dim=1)
        self.mask = torch.ones_like(self.buf)
        self._advance()

    def _advance(self) -> None:
        t = self.t
        logits, _, _ = self.lane.advance(self.buf[:, :t], self.mask[:, :t], self.rows, self.resumed)
        self.buf[:, t] = logits.argmax(-1)
        self.t += 1

    def steps(self, n: int, sync) -> float:
        """``n`` one-token steps; seconds per step (device synchronised)."""
        sync()
        start = time.perf_counter()
        for _ in range(n):
            self._advance()
        sync()
        return (time.perf_counter() - start) / n


SEQUENCE = 64  # kernels of the first profiled step listed in order (its first layers), with their times


def profile_steps(rows: Rows, n: int, sync) -> dict:
    """Device kernels of ``n`` steps, per step, grouped by family, with the costliest kernels, and the first
    :data:`SEQUENCE` kernels in order."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        rows.steps(n, sync)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    first = sorted(kernels, key=lambda e: e.time_range.start)[:SEQUENCE]
    return {**summarize(kernels, n), "sequence": [f"{e.name[:60]} {e.device_time:.1f}us" for e in first]}


def one_batch(model, batch: int, args, device: str, bw: float) -> dict:
    sync = lambda: lab.sync(device)  # noqa: E731
    cfg = FastConfig(compile="parts") if device == "cuda" else FastConfig(graphs=False, max_bucket=8)
    room = 3 * args.steps + 8
    lane = FastLane(model, Role.LLM, model.config.vocab_size, max(args.capacity, args.context + room + 8), cfg,
                    max_rows=batch)
    gen = torch.Generator().manual_seed(batch)
    ids = torch.randint(10, model.config.vocab_size - 10, (batch, args.context), generator=gen).to(device)
    rows = Rows(lane, ids, room)
    rows.steps(4, sync)  # capture, compile
    step_s = rows.steps(args.steps, sync)
    profile = profile_steps(rows, args.steps, sync) if device == "cuda" else {}
    weights = eb.weight_bytes(model)["decode_read_bytes"]
    kv = lane.cache.nbytes() / lane.cache.n_slots / lane.cache.n_rows * batch * (args.context + args.steps)
    floor_s = (weights + kv) / (bw * 1e9)
    return {"batch": batch, "context": args.context, "ms_per_step": 1e3 * step_s, "floor_ms": 1e3 * floor_s,
            "x_floor": step_s / floor_s, "kv_gb_per_step": kv / 1e9, "profile": profile}


def markdown(result: dict) -> str:
    env = result["environment"]
    lines = [f"# Decode step of the fast engine: random Qwen2 ({', '.join(result['args']['models'])}), bf16, "
             f"{env['devices'][0]}", "",
             f"torch {env['torch']}, transformers {env['transformers']}, {env['date']}; `compile=\"parts\"` with the "
             f"fused kernels; every row prefilled with {result['args']['context']} tokens, then one-token graph "
             "replays in a bare loop (no policy, no host wait per step). Floor: weights plus the KV the step reads, "
             "over the measured copy bandwidth. Cache: "
             f"{str(result['args']['capacity']) + ' slots a row' if result['args']['capacity'] else 'the slots the steps need'}.",
             "",
             "PDL: programmatic dependent launch of the Triton kernels. Defer: q and k rotated inside the cache's "
             "store kernel (`rope_store.DEFER`).", "",
             "| model | PDL | defer | splits share | attention plan | B | ms/step | floor (ms) | x floor | "
             "kernel ms/step | kernels/step | top kernels (ms/step) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        p = r["profile"] or {"top_kernels_ms": {}, "kernel_ms_per_token": 0.0, "kernels_per_token": 0}
        top = "; ".join(f"{k[:40]} {v:.2f}" for k, v in list(p["top_kernels_ms"].items())[:5])
        lines.append(f"| {r.get('model', '7b')} | {r.get('pdl', 'off')} | {r.get('defer', 'off')} | {r.get('split_basis', 'capacity')} | "
                     f"{r['attention_plan']} | {r['batch']} | "
                     f"{r['ms_per_step']:.2f} | {r['floor_ms']:.2f} | {r['x_floor']:.2f} | "
                     f"{p['kernel_ms_per_token']:.2f} | {p['kernels_per_token']:.0f} | {top} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=str(lab.RESULTS))
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--context", type=int, default=1400, help="tokens in each row's cache before the timed steps")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--attention-plans", nargs="+", default=[None],
                    help="plans of the split attention ('default' or 'NAME=value,...', see benchmarks/attention_sweep.py) (hf_rstitch.fast.decode_attention), "
                         "each a run")
    ap.add_argument("--split-bases", nargs="+", default=["written"], choices=["written", "capacity"],
                    help="what the splits share (decode_attention.SPLIT_BASIS), each a run: the written slots or "
                         "the capacity (the earlier plan)")
    ap.add_argument("--capacity", type=int, default=0,
                    help="cache slots of each lane (default: just what the steps need); a long cache with a short "
                         "context is where the split bases differ")
    ap.add_argument("--models", nargs="+", default=["7b"], choices=["7b", "1.5b"],
                    help="random Qwen2 shapes to time, each a run (the workload's LLM and SLM)")
    ap.add_argument("--pdl", nargs="+", default=[triton_support.PDL], choices=["off", "one-row", "all"],
                    help="programmatic dependent launch of the Triton kernels (hf_rstitch.fast.triton_support.PDL), each a run")
    ap.add_argument("--defer", nargs="+", default=["on"], choices=["off", "on"],
                    help="rotate q and k inside the cache's store kernel (hf_rstitch.fast.rope_store.DEFER), each a run")
    ap.add_argument("--name", default="engine_profile_batched", help="result files: <name>_<gpu>.json and .md")
    ap.add_argument("--dry-run-cpu", action="store_true", help="a tiny model on CPU: checks the script, times nothing")
    args = ap.parse_args()
    device = "cpu" if args.dry_run_cpu else "cuda"
    if args.dry_run_cpu:
        args.context, args.steps, args.batches = 12, 3, [2, 3]
    eb.DEVICE = device
    llm, slm = lab.random_pair("tiny" if args.dry_run_cpu else "qwen2", device)
    bw = eb.copy_bandwidth(2 << 30 if device == "cuda" else 1 << 24)
    rows = []
    runs = [(m, d, f, b, p) for m in args.models for d in args.pdl for f in args.defer for b in args.split_bases
            for p in args.attention_plans]
    for name, launch, defer, basis, plan in runs:
        model = llm if name == "7b" else slm
        triton_support.PDL = launch
        rope_store.DEFER = defer == "on"
        decode_attention.SPLIT_BASIS = basis
        set_plan(plan or "default")
        for b in args.batches:
            rows.append({"model": name, "pdl": launch, "defer": defer, "attention_plan": plan or "default",
                         "split_basis": basis, **one_batch(model, b, args, device, bw)})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "profile"}), flush=True)
            if device == "cuda":
                torch.cuda.empty_cache()
    result = {"environment": lab.environment([device] if device == "cuda" else []), "args": vars(args),
              "bandwidth_gbps": bw, "rows": rows}
    if not result["environment"]["devices"]:
        result["environment"]["devices"] = ["cpu dry run"]
    tag = result["environment"]["devices"][0].lower().replace(" ", "_")
    lab.write_result(Path(args.out_dir) / f"{args.name}_{tag}", result, markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
