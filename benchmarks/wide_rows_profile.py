"""Where a one-token step of many rows spends its time: the LLM's (random Qwen2 7B shape) device kernels by name at
B = 64, 128, 256, next to the graph-replayed step, so the cost past 64 rows (products on cuBLAS GEMMs,
``hf_rstitch.fast.kernels.gemv.GEMM_ROWS``) is read from kernels, not guessed.

    PYTHONPATH=. python benchmarks/wide_rows_profile.py --out-dir $OUT            # one GPU, ~60 s
    PYTHONPATH=. python benchmarks/wide_rows_profile.py --out-dir /tmp/w --cpu-smoke

Per batch size: a FastLane of that many rows (default FastConfig, eager steps for the profile: the kernels a graph
records) prefills ``--prompt`` tokens a row, then ``--steps`` one-token steps run under ``torch.profiler``; then a
lane with CUDA graphs times the same steps. Writes ``wide_rows_profile_<gpu>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import lab  # noqa: E402

from hf_rstitch.core.roles import Role  # noqa: E402
from hf_rstitch.fast import FastConfig, FastLane  # noqa: E402


def steps(lane: FastLane, ids: torch.Tensor, n: int) -> float:
    """Prefill ``ids`` ``[B, T]``, then ``n`` greedy one-token steps; device-synchronised seconds a step."""
    b, t = ids.shape
    rows, resumed = torch.ones(b, dtype=torch.bool), torch.zeros(b, dtype=torch.bool)
    buf = torch.cat([ids, ids.new_zeros(b, n + 1)], dim=1)
    mask = torch.ones_like(buf)
    logits, _, _ = lane.advance(buf[:, :t], mask[:, :t], rows, resumed)
    buf[:, t] = logits.argmax(-1)
    lab.sync(ids.device)
    t0 = time.perf_counter()
    for i in range(1, n + 1):
        logits, _, _ = lane.advance(buf[:, : t + i], mask[:, : t + i], rows, resumed)
        buf[:, t + i] = logits.argmax(-1)
    lab.sync(ids.device)
    return (time.perf_counter() - t0) / n


def profile(model, batch: int, args, device: str) -> dict:
    vocab = model.config.vocab_size
    ids = torch.randint(10, vocab - 10, (batch, args.prompt), generator=torch.Generator().manual_seed(0)).to(device)
    capacity = args.prompt + 2 * args.steps + 16
    eager = FastLane(model, Role.LLM, vocab, capacity, FastConfig(graphs=False), max_rows=batch)
    steps(eager, ids, 2)
    eager.reset()
    cuda = device == "cuda"
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts) as prof:
        eager_s = steps(eager, ids, args.steps)
    del eager
    names: dict[str, float] = collections.defaultdict(float)
    count: dict[str, int] = collections.Counter()
    for e in prof.events():
        if cuda and e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if not cuda and not (e.name.startswith("aten::") and not e.cpu_children):
            continue
        names[e.name[:100]] += e.device_time if cuda else e.cpu_time
        count[e.name[:100]] += 1
    n = args.steps + 1  # the region holds the prefill too: its kernels spread over the steps
    top = sorted(names.items(), key=lambda kv: -kv[1])[:14]
    row = {"batch": batch, "eager_ms_per_step": 1e3 * eager_s, "kernel_ms_per_step": sum(names.values()) / 1e3 / n,
           "kernels_per_step": sum(count.values()) / n,
           "top_kernels": [{"name": k, "ms_per_step": us / 1e3 / n, "calls_per_step": count[k] / n} for k, us in top]}
    if cuda:
        graphs = FastLane(model, Role.LLM, vocab, capacity, FastConfig(), max_rows=batch)
        steps(graphs, ids, 2)
        graphs.reset()
        row["graph_ms_per_step"] = 1e3 * steps(graphs, ids, args.steps)
        del graphs
        torch.cuda.empty_cache()
    print(f"[B={batch}] graph {row.get('graph_ms_per_step', 0):.2f} ms, kernels {row['kernel_ms_per_step']:.2f} ms; "
          + "; ".join(f"{t['name'][:60]} {t['ms_per_step']:.2f}" for t in row["top_kernels"][:6]), flush=True)
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--cpu-smoke", action="store_true", help="a tiny model on CPU: checks the script only")
    args = ap.parse_args(argv)
    device = "cpu" if args.cpu_smoke else "cuda"
    if device == "cpu":
        model = lab.tiny_qwen2(64, 2, 0)
    else:
        from hf_rstitch.latency.profiler import random_qwen2
        model = random_qwen2("7b", torch.bfloat16, "cuda")
    env = lab.environment([device])
    doc = {"device": env["devices"][0], **env, "args": vars(args), "rows": []}
    gpu = re.sub(r"[^a-z0-9]+", "_", doc["device"].lower()).strip("_") if not args.cpu_smoke else "cpu_smoke"
    stem = Path(args.out_dir) / f"wide_rows_profile_{gpu}"
    with torch.no_grad():
        for b in args.batches:
            doc["rows"].append(profile(model, b, args, device))
            lab.write_result(stem, doc, markdown(doc))
    print(markdown(doc))


def markdown(doc: dict) -> str:
    lines = [f"# A one-token step of many rows, random Qwen2 7B shape, {doc['device']}", "",
             f"torch {doc['torch']}, transformers {doc['transformers']}, {doc['date']}; prompt {doc['args']['prompt']}.",
             "", "| B | graph ms/step | eager kernels ms/step | kernels/step | top kernels (ms/step) |", "|---|---|---|---|---|"]
    for r in doc["rows"]:
        top = "; ".join(f"`{t['name'][:50]}` {t['ms_per_step']:.2f}" for t in r["top_kernels"][:5])
        lines.append(f"| {r['batch']} | {r.get('graph_ms_per_step', float('nan')):.2f} | {r['kernel_ms_per_step']:.2f} | "
                     f"{r['kernels_per_step']:.0f} | {top} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
