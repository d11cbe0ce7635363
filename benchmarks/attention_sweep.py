"""The split decode attention alone (hf_rstitch.fast.decode_attention), over its launch plans, against its KV floor.

    PYTHONPATH=.:benchmarks python benchmarks/attention_sweep.py --out-dir $OUT          # CUDA, ~1 min
    TRITON_INTERPRET=1 PYTHONPATH=.:benchmarks python benchmarks/attention_sweep.py --dry-run-cpu --out-dir /tmp/a

One decode step's attention for a random Qwen2 shape (``--model``: the 7B's 28 query and 4 KV
heads, the 1.5B's 12 and 2; 28 layers, head size 128, bf16): every layer's query against its own
static cache of ``--capacity`` slots with ``--context`` written, the layers captured as one CUDA
graph and replayed. Each plan (``default``, or ``NAME=value,...`` over it, for the module's
constants in :data:`NAMES`) is a run at every batch size. Floor: the K and V bytes of the written slots over the measured copy
bandwidth. Writes ``<name>_<gpu>.json`` and ``.md``: ms a step, x floor, and the best plan per batch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import lab
from hf_rstitch.fast.kernels import decode_attention as da

SHAPES = {"7b": (28, 4), "1.5b": (12, 2), "0.6b": (16, 8), "8b": (32, 8)}  # (query heads, KV heads); both have 28 layers of head size 128
LAYERS, HEAD_DIM = 28, 128
NAMES = ("COMBINE_IN_SPLIT", "FILL", "MAX_SPLITS", "SPLIT_BLOCK_N", "SPLIT_STAGES", "ONE_SPLIT", "ONE_BLOCK_N", "ONE_STAGES", "WARPS")
DEFAULTS = {n: getattr(da, n) for n in NAMES}
# the plan before one-split launches (five splits of 64-slot blocks for the 7B at B = 64)
BEFORE = "FILL=8,SPLIT_BLOCK_N=64,ONE_SPLIT=99"


def set_plan(plan: str) -> None:
    """``"default"`` (the module's plan) or ``"NAME=value,..."`` over it, NAME one of :data:`NAMES`."""
    for name, value in DEFAULTS.items():
        setattr(da, name, value)
    for item in filter(None, plan.split(",") if plan != "default" else []):
        name, _, value = item.partition("=")
        if name not in NAMES:
            raise SystemExit(f"unknown plan constant {name!r} in {plan!r}; one of {', '.join(NAMES)}")
        setattr(da, name, float(value) if name == "ONE_SPLIT" else bool(int(value)) if name == "COMBINE_IN_SPLIT" else int(value))


class Step:
    """Every layer's attention of one decode step over ``batch`` rows, as a replayable graph on CUDA."""

    def __init__(self, model: str, batch: int, context: int, capacity: int, layers: int, device: str):
        heads, kv_heads = SHAPES[model]
        g = torch.Generator(device).manual_seed(batch)
        new = lambda *shape: torch.randn(*shape, generator=g, device=device, dtype=torch.bfloat16)  # noqa: E731
        self.q = [new(batch, heads, 1, HEAD_DIM) for _ in range(layers)]
        self.kv = [(new(batch, kv_heads, capacity, HEAD_DIM), new(batch, kv_heads, capacity, HEAD_DIM))
                   for _ in range(layers)]
        self.pos = torch.tensor(context - 1, device=device)  # slots written before this step's query
        self.pad = torch.zeros(batch, dtype=torch.long, device=device)
        self.kv_bytes = layers * 2 * batch * kv_heads * context * HEAD_DIM * 2
        self.shape = (batch, kv_heads, heads // kv_heads, capacity)
        self.graph = None

    def run(self) -> None:
        for q, (k, v) in zip(self.q, self.kv):
            da.decode_attention_op(q, k, v, self.pos, self.pad, HEAD_DIM ** -0.5)

    def capture(self) -> None:
        stream = torch.cuda.Stream()  # warm-up and capture on one side stream, as the lanes' GraphRunner does
        with torch.cuda.stream(stream):
            self.run()  # compiles this plan's kernels
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=stream):
            self.run()

    def time_ms(self, repeats: int) -> float:
        if self.graph is None:
            self.run()
            return float("nan")
        for _ in range(3):
            self.graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            self.graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / repeats


def markdown(result: dict) -> str:
    a, env = result["args"], result["environment"]
    lines = [f"# Split decode attention alone: random Qwen2 {a['model']} shape, bf16, {env['devices'][0]}", "",
             f"torch {env['torch']}, {env['date']}; {a['layers']} layers a step, {a['context']} slots written of "
             f"{a['capacity']}, one CUDA graph a step. Floor: K and V of the written slots over "
             f"{result['bandwidth_gbps']:.0f} GB/s (copy bandwidth). Plans: `default` is the module's; "
             f"`before` is `{BEFORE}`.", "",
             "| B | plan | splits | ms/step | floor (ms) | x floor |", "|---|---|---|---|---|---|"]
    best = {}
    for r in result["rows"]:
        if r["batch"] not in best or r["ms_per_step"] < best[r["batch"]]["ms_per_step"]:
            best[r["batch"]] = r
    for r in result["rows"]:
        mark = " **best**" if best[r["batch"]] is r else ""
        lines.append(f"| {r['batch']} | {r['plan']}{mark} | {r['splits']} | {r['ms_per_step']:.3f} | {r['floor_ms']:.3f} | "
                     f"{r['x_floor']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=str(lab.RESULTS))
    ap.add_argument("--model", default="7b", choices=list(SHAPES))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--context", type=int, default=1400, help="slots written in each row's cache")
    ap.add_argument("--capacity", type=int, default=3072, help="slots of each row's cache")
    ap.add_argument("--plans", nargs="+", default=["default", "before"],
                    help="attention plans, each a run: 'default', 'before' (the plan before one-split launches) or "
                         f"'NAME=value,...' over the default, NAME one of {', '.join(NAMES)}")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--name", default="attention_sweep", help="result files: <name>_<gpu>.json and .md")
    ap.add_argument("--dry-run-cpu", action="store_true",
                    help="small shapes through Triton's interpreter (TRITON_INTERPRET=1): checks the script, times nothing")
    args = ap.parse_args()
    device = "cpu" if args.dry_run_cpu else "cuda"
    args.layers = 2 if args.dry_run_cpu else LAYERS
    if args.dry_run_cpu:
        args.batches, args.context, args.capacity, args.plans = [1, 2], 40, 64, args.plans[:2]
    bw = lab.copy_bandwidth(device) if device == "cuda" else 1.0
    rows = []
    for b in args.batches:
        step = Step(args.model, b, args.context, args.capacity, args.layers, device)
        for plan in args.plans:
            set_plan(BEFORE if plan == "before" else plan)
            if device == "cuda":
                step.capture()
            ms = step.time_ms(args.repeats)
            floor = 1e3 * step.kv_bytes / (bw * 1e9)
            batch, kv_heads, group, capacity = step.shape
            splits = da._plan(batch, kv_heads, group, capacity, da._sm_count(torch.device(device)))[2]
            da._TICKETS.clear()
            rows.append({"batch": b, "plan": plan, "splits": splits, "ms_per_step": ms, "floor_ms": floor, "x_floor": ms / floor})
            rows[-1]["us_per_layer"] = 1e3 * ms / args.layers
            print(json.dumps(rows[-1]), flush=True)
        del step
        if device == "cuda":
            torch.cuda.empty_cache()
    set_plan("default")
    result = {"environment": lab.environment([device] if device == "cuda" else []), "args": vars(args),
              "bandwidth_gbps": bw, "rows": rows}
    if not result["environment"]["devices"]:
        result["environment"]["devices"] = ["cpu dry run"]
    tag = result["environment"]["devices"][0].lower().replace(" ", "_")
    model = args.model.replace(".", "_")  # 1.5b: no dot in the stem (it would read as a suffix)
    lab.write_result(Path(args.out_dir) / f"{args.name}_{model}_{tag}", result, markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
