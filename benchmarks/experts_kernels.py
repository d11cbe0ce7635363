"""MoE experts of a decode step, one dispatch against another, on the Qwen3-30B-A3B expert shape (bf16, one GPU).

    PYTHONPATH=. python benchmarks/experts_kernels.py --out-dir $OUT [--batches 1 8 32] [--layers 8]

Question: how long do the experts of one layer take per dispatch -- transformers' ``grouped_mm`` and
``batched_mm`` against our decode kernels (``hf_rstitch.fast.kernels.expert_gemv``, several launch configurations) --
for B rows of a decode step (B x top-8 (row, expert) pairs of 128 experts, hidden 2048, intermediate 768),
and how far is each from its floor (the bytes of the distinct experts the rows select, over the measured
copy bandwidth)? Each dispatch runs ``--layers`` layers of distinct random weights (so the L2 cache holds
none of them between layers) with random routing, captured in one CUDA graph (which also proves it
graph-safe); the graph is replayed and timed with CUDA events. The kernels' outputs are checked against
``grouped_mm``'s on the same inputs.

Writes ``experts_kernels_<gpu>.json`` / ``.md`` (lab.write_result); prints the table last.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import lab  # noqa: E402

from hf_rstitch.fast.kernels import expert_gemv, expert_major  # noqa: E402

SHAPE = dict(experts=128, top_k=8, hidden=2048, inter=768)  # Qwen3-30B-A3B
L = expert_gemv.Launch
GATE_UP = (L(16, 256, 4), L(16, 512, 4), L(32, 256, 8), L(8, 512, 4))  # candidates for each kernel alone
DOWN = (L(4, 512, 4), L(8, 256, 4), L(8, 512, 4), L(16, 256, 4))
SPLIT = (L(16, 256, 4), L(8, 256, 4), L(8, 512, 4), L(32, 128, 4), L(16, 512, 8))
M = expert_major.Launch  # one program an expert (several rows): pairs together, columns, reduction chunk, warps
MAJOR_GATE_UP = (M(16, 32, 128, 4), M(16, 16, 256, 4), M(16, 64, 64, 4), M(16, 32, 256, 8), M(32, 32, 128, 4))
MAJOR_DOWN = (M(16, 64, 128, 4), M(16, 32, 128, 4), M(16, 128, 64, 4), M(16, 64, 256, 8), M(16, 16, 256, 4))


def experts_module(shape, device, dtype, seed):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    config = Qwen3MoeConfig(hidden_size=shape["hidden"], moe_intermediate_size=shape["inter"],
                            num_experts=shape["experts"], num_experts_per_tok=shape["top_k"])
    module = Qwen3MoeExperts(config).to(device=device, dtype=dtype)
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in (module.gate_up_proj, module.down_proj):
            p.normal_(0, 0.02, generator=g)
    return module


def routing(batch, shape, layers, device, dtype, seed):
    """Per layer: x [B, H], top-k ids and softmax weights (as Qwen3-MoE's router gives them)."""
    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for _ in range(layers):
        x = torch.randn(batch, shape["hidden"], device=device, generator=g).to(dtype)
        logits = torch.randn(batch, shape["experts"], device=device, generator=g)
        w, ids = torch.topk(logits.softmax(-1), shape["top_k"], dim=-1)
        out.append((x, ids, (w / w.sum(-1, keepdim=True)).to(dtype)))
    return out


def dispatches():
    """name -> fn(module, x, ids, w): transformers' two, ours as the lane runs it (``expert_gemv.forward``: the
    chosen launches, the fallback past ``MAX_PAIRS``), and each kernel alone under candidate launches (down on a
    fixed activation; "split": one program a pair, then the sum)."""
    from transformers.integrations import moe

    fns = {"grouped_mm": moe.grouped_mm_experts_forward, "batched_mm": moe.batched_mm_experts_forward,
           expert_gemv.NAME: expert_gemv.forward}
    fns[f"{expert_gemv.NAME} pair kernels"] = _pair_kernels
    major = lambda c: f"{c.block_m}x{c.block_n}x{c.block_k}w{c.warps}"  # noqa: E731
    for c in MAJOR_GATE_UP:
        fns[f"by-expert gate_up only {major(c)}"] = lambda m, x, ids, w, c=c: expert_major.gate_up(x, m.gate_up_proj,
                                                                                                    ids, c)
    for c in MAJOR_DOWN:
        fns[f"by-expert down only {major(c)}"] = (
            lambda m, x, ids, w, c=c: expert_major.down(_act(x, m, ids), m.down_proj, ids, w, c))
    name = lambda c: f"{c.block_n}x{c.block_k}w{c.warps}"  # noqa: E731
    for c in GATE_UP:
        fns[f"gate_up only {name(c)}"] = lambda m, x, ids, w, c=c: expert_gemv.gate_up(x, m.gate_up_proj, ids, c)
    for split, configs in ((False, DOWN), (True, SPLIT)):
        for c in configs:
            fns[f"down{' split' if split else ''} only {name(c)}"] = (
                lambda m, x, ids, w, c=c, split=split: expert_gemv.down(_act(x, m, ids), m.down_proj, ids, w, c, split))
    return fns


def _pair_kernels(module, x, ids, w):
    """``expert_gemv.forward`` with the pair kernels at every batch size (``BY_EXPERT`` off while it records)."""
    expert_gemv.BY_EXPERT = False
    try:
        return expert_gemv.forward(module, x, ids, w)
    finally:
        expert_gemv.BY_EXPERT = True


_ACTS = {}


def _act(x, module, ids):
    """A fixed activation for the down kernel timed alone (made once, outside any capture)."""
    key = (id(module), ids.shape)
    if key not in _ACTS:
        _ACTS[key] = torch.randn(ids.numel(), module.down_proj.shape[-1], device=x.device, dtype=x.dtype)
    return _ACTS[key]


def time_graph(fn, modules, inputs, replays):
    """Median ms of one replay of a graph that runs ``fn`` over every layer."""
    step = lambda: [fn(m, *inp) for m, inp in zip(modules, inputs)]  # noqa: E731
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile / warm outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), outs


def distinct_bytes(inputs, module) -> float:
    """Bytes of the distinct experts each layer selects, averaged over the layers."""
    per_expert = (module.gate_up_proj[0].numel() + module.down_proj[0].numel()) * module.down_proj.element_size()
    return statistics.mean(per_expert * ids.unique().numel() for _, ids, _ in inputs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=str(lab.RESULTS))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--max-pairs", type=int, default=expert_gemv.MAX_PAIRS,
                    help="expert_gemv.MAX_PAIRS for the rstitch_gemv rows (pairs past it run grouped_mm)")
    ap.add_argument("--only", nargs="*", default=None,
                    help="time only the dispatches whose name contains one of these (default: all)")
    args = ap.parse_args()
    import engine_bench as eb

    expert_gemv.MAX_PAIRS = args.max_pairs
    device, dtype = "cuda", torch.bfloat16
    bw = eb.copy_bandwidth(2 << 30)
    modules = [experts_module(SHAPE, device, dtype, seed) for seed in range(args.layers)]
    rows, fns = [], dispatches()
    if args.only:
        fns = {k: v for k, v in fns.items() if k == "grouped_mm" or any(o in k for o in args.only)}
    with torch.no_grad():
        for batch in args.batches:
            inputs = routing(batch, SHAPE, args.layers, device, dtype, 100 + batch)
            floor_ms = 1e3 * distinct_bytes(inputs, modules[0]) / (bw * 1e9)
            ref = None
            for name, fn in fns.items():
                row = {"batch": batch, "pairs": batch * SHAPE["top_k"], "dispatch": name, "floor_us": 1e3 * floor_ms}
                try:
                    ms, outs = time_graph(fn, modules, inputs, args.replays)
                    row.update(us_per_layer=1e3 * ms / args.layers, x_floor=ms / args.layers / floor_ms)
                    if name == "grouped_mm":
                        ref = [o.float() for o in outs]
                    elif ref is not None and "only" not in name:
                        row["max_rel_err"] = max(((o.float() - r).abs().max() / r.abs().max()).item()
                                                 for o, r in zip(outs, ref))
                except Exception as err:  # a dispatch that fails or cannot be captured here: say so, keep the run
                    row["error"] = f"{type(err).__name__}: {err}"[:300]
                rows.append(row)
                print(row, flush=True)
    gpu = re.sub(r"[^a-z0-9]+", "_", torch.cuda.get_device_name().lower()).strip("_")
    lines = [f"# MoE experts of one decode layer: Qwen3-30B-A3B shape (128 experts, top-8, hidden 2048, "
             f"intermediate 768), bf16, {torch.cuda.get_device_name()}", "",
             f"Copy bandwidth {bw:.0f} GB/s; floor: distinct selected experts' bytes / bandwidth; "
             f"{args.layers} layers of distinct weights in one CUDA graph.", "",
             "| B | pairs | dispatch | us / layer | floor us | x floor | max rel err vs grouped_mm |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['pairs']} | {r['dispatch']} | {r.get('us_per_layer', float('nan')):.1f} | "
                     f"{r['floor_us']:.1f} | {r.get('x_floor', float('nan')):.2f} | "
                     f"{r.get('max_rel_err', r.get('error', '-'))} |")
    lab.write_result(Path(args.out_dir) / f"experts_kernels_{gpu}",
                     {"environment": lab.environment([device]), "shape": SHAPE, "bandwidth_gbps": bw, "rows": rows},
                     "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
