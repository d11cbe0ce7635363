"""Where a fast-engine decode step spends its time: kernels per token, grouped (one GPU, B = 1).

    PYTHONPATH=. python benchmarks/engine_profile.py --out $OUT/engine_profile.json   # CUDA, ~1 min
    PYTHONPATH=. python benchmarks/engine_profile.py --cpu-smoke --out /tmp/p.json    # checks the script

The fast engine's `graphs` variant ran at ~5 ms per token above the bandwidth floor for both the
1.5B and the 7B shape (H200, 2026-11-26, fused SDPA attention). Two suspects
(docs/fast-engine.md#numbers): the number of small kernels a graph still launches, and the
attention kernel. This script answers which, without guessing, for each attention
(``--attention matmul sdpa``): it decodes with a FastLane whose static-cache steps run *eagerly*
(``graphs=False``: the same kernels a graph records), profiles ``--steps`` one-token steps with
``torch.profiler``, and reports per token: the number of device kernels, their summed device time,
the host time of the step, and the device time grouped by kernel family (GEMM, attention,
elementwise, reduction, copy, other). Then it times the same steps replayed as CUDA graphs. Kernel
time inside graphs is the eager kernels' time minus launch gaps; the gap between
"graph ms/token" and "kernel ms/token" is what a graph still pays between kernels.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import sys
import time
from pathlib import Path

import torch
import transformers

import lab
from hf_rstitch.core.roles import Role
from hf_rstitch.fast import FastConfig, FastLane

FAMILIES = (  # first match wins; names as CUDA / CPU profilers print them
    ("attention", ("attention", "fmha", "flash", "softmax", "sdpa")),
    ("gemm", ("gemm", "gemv", "matmul", "mm", "cublas", "cutlass", "linear", "addmm", "bmm", "nvjet", "sm90")),
    ("copy", ("copy", "memcpy", "index", "cat", "scatter", "gather", "fill")),
    ("reduction", ("reduce", "mean", "sum", "norm", "max", "argmax")),
    ("elementwise", ("elementwise", "vectorized", "mul", "add", "rsqrt", "pow", "neg", "silu", "exp", "where",
                     "masked", "unrolled")),
)


def family(name: str) -> str:
    low = name.lower()
    for fam, keys in FAMILIES:
        if any(k in low for k in keys):
            return fam
    return "other"


def summarize(events, n: int) -> dict:
    """Device kernel ``events`` of ``n`` tokens (or steps), per token: count, time, by family, costliest names."""
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


def build(size: str, device: str, dtype: torch.dtype):
    if device == "cpu":
        from transformers import Qwen2Config, Qwen2ForCausalLM

        torch.manual_seed(0)
        cfg = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2)
        return Qwen2ForCausalLM(cfg).to(dtype).eval()
    from hf_rstitch.latency.profiler import random_qwen2

    return random_qwen2(size, dtype, device)


def decode_steps(lane: FastLane, ids: torch.Tensor, n: int, sync) -> float:
    """Prefill ``ids`` then ``n`` greedy one-token steps; seconds per step (device synchronised)."""
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


def profile_size(size: str, attention: str, args, device: str) -> dict:
    dtype = torch.bfloat16
    model = build(size, device, dtype)
    vocab = model.config.vocab_size
    ids = torch.randint(10, vocab - 10, (1, args.prompt), generator=torch.Generator().manual_seed(0)).to(device)

    def sync():
        lab.sync(device)

    eager = FastLane(model, Role.LLM, vocab, args.capacity, FastConfig(graphs=False, attention=attention))
    decode_steps(eager, ids, 4, sync)  # warm-up
    eager.reset()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        eager_s = decode_steps(eager, ids, args.steps, sync)
    events = [e for e in prof.events() if (e.device_type == torch.autograd.DeviceType.CUDA) == (device == "cuda")]
    if device == "cpu":  # no device kernels: count the leaf aten ops instead
        events = [e for e in events if e.name.startswith("aten::") and not e.cpu_children]
    per_family: dict[str, float] = collections.defaultdict(float)
    count: dict[str, int] = collections.Counter()
    names: dict[str, float] = collections.defaultdict(float)
    for e in events:
        us = e.device_time if device == "cuda" else e.cpu_time
        fam = family(e.name)
        per_family[fam] += us
        count[fam] += 1
        names[e.name[:90]] += us
    steps = args.steps + 1  # the profiled region also holds the prefill; close enough per token
    row = {
        "size": size,
        "attention": attention,
        "eager_static_ms_per_token": 1e3 * eager_s,
        "kernels_per_token": len(events) / steps,
        "kernel_ms_per_token": sum(per_family.values()) / 1e3 / steps,
        "by_family_ms_per_token": {k: v / 1e3 / steps for k, v in sorted(per_family.items(), key=lambda kv: -kv[1])},
        "kernels_by_family_per_token": {k: v / steps for k, v in count.items()},
        "top_kernels_ms_per_token": {k: v / 1e3 / steps for k, v in sorted(names.items(), key=lambda kv: -kv[1])[:15]},
    }
    del eager
    if device == "cuda":
        graphs = FastLane(model, Role.LLM, vocab, args.capacity, FastConfig(attention=attention))
        decode_steps(graphs, ids, 4, sync)  # capture
        graphs.reset()
        row["graph_ms_per_token"] = 1e3 * decode_steps(graphs, ids, args.steps, sync)
        del graphs
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    print(json.dumps(row, indent=1), flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["1.5b", "7b"], choices=["1.5b", "7b"])
    ap.add_argument("--attention", nargs="+", default=["matmul", "sdpa"], choices=["matmul", "sdpa"],
                    help="static-cache attention(s) to profile (FastConfig.attention)")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32, help="profiled one-token steps")
    ap.add_argument("--capacity", type=int, default=3072, help="static cache capacity (as engine_bench)")
    ap.add_argument("--cpu-smoke", action="store_true", help="a tiny model on CPU: checks the script only")
    ap.add_argument("--out", default="benchmarks/results/engine_profile.json")
    args = ap.parse_args()
    device = "cpu" if args.cpu_smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA device; use --cpu-smoke to check the script")
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu smoke",
              "torch": torch.__version__, "transformers": transformers.__version__,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "args": vars(args), "rows": []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for size in args.sizes:
        for attention in args.attention:
            result["rows"].append(profile_size(size, attention, args, device))
            out.write_text(json.dumps(result, indent=1) + "\n")
    keys = ("size", "attention", "eager_static_ms_per_token", "graph_ms_per_token", "kernels_per_token",
            "kernel_ms_per_token")
    print(json.dumps({"device": result["device"], "rows": [{k: r.get(k) for k in keys} for r in result["rows"]]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
