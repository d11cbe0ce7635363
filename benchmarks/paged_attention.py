"""Does reading the KV cache through block tables cost decode attention anything? Paged vs static slab.

One decode step's attention of one Qwen2-7B layer (28 query heads, 4 KV heads, head size 128, bf16) through the
split kernel (:mod:`hf_rstitch.fast.kernels.decode_attention`), at batch B and context length L: once over a static
slab ``[B, H_kv, slots, D]`` and once over a paged pool (:mod:`hf_rstitch.fast.paged_kv`, blocks of 16 tokens
handed out in a shuffled order, as after many rows came and went). Reports the median microseconds a call
(CUDA events over ``--iters`` calls, ``--repeats`` times), the bytes of keys and values read per call over that
time (GB/s), and the largest difference between the two outputs (they must agree).

    PYTHONPATH=. python benchmarks/paged_attention.py --out-dir /tmp/out --batches 1 8 64 --contexts 4096 32768

Prints a markdown table last; writes ``paged_attention_<gpu>.{json,md}`` under ``--out-dir``
(default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from lab import RESULTS, environment, write_result

from hf_rstitch.fast.blocks import BLOCK_TOKENS, TRASH
from hf_rstitch.fast.buckets import round_up
from hf_rstitch.fast.static_kv import KV_CHUNK

HEADS, KV_HEADS, DIM = 28, 4, 128  # Qwen2-7B


def _call(query, key, value, pos, pad, table=None):
    return torch.ops.hf_rstitch.decode_attention(query, key, value, pos, pad, DIM ** -0.5, 1 << 30, 0.0, None, table)


def _time(fn, iters: int, repeats: int) -> float:
    """Median microseconds a call."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / iters)
    return statistics.median(times)


def case(batch: int, context: int, iters: int, repeats: int, seed: int = 0, dev: str = "cuda") -> dict:
    import hf_rstitch.fast.kernels.decode_attention  # noqa: F401  (registers the op)

    g = torch.Generator(device=dev).manual_seed(seed)
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    slots = round_up(context + 128, KV_CHUNK)
    query = torch.randn(batch, 1, HEADS, DIM, device=dev, dtype=dtype, generator=g).transpose(1, 2)
    pos = torch.tensor(context - 1, device=dev)
    pad = torch.zeros(batch, dtype=torch.long, device=dev)
    key = torch.randn(batch, KV_HEADS, slots, DIM, device=dev, dtype=dtype, generator=g)
    value = torch.randn(batch, KV_HEADS, slots, DIM, device=dev, dtype=dtype, generator=g)
    width = -(-slots // BLOCK_TOKENS)
    used = -(-context // BLOCK_TOKENS)
    n_blocks = 1 + batch * used
    order = torch.randperm(n_blocks - 1, generator=torch.Generator().manual_seed(seed)) + 1
    table = torch.full((batch, width), TRASH, dtype=torch.int32)
    table[:, :used] = order.view(batch, used).to(torch.int32)
    table = table.to(dev)
    pool_k = torch.zeros(n_blocks, KV_HEADS, BLOCK_TOKENS, DIM, device=dev, dtype=dtype)
    pool_v = torch.zeros_like(pool_k)
    flat = table[:, :used].long()  # [b, used]
    for pool, src in ((pool_k, key), (pool_v, value)):
        blocks = src[:, :, : used * BLOCK_TOKENS].reshape(batch, KV_HEADS, used, BLOCK_TOKENS, DIM)
        pool[flat] = blocks.permute(0, 2, 1, 3, 4)
    want = _call(query, key, value, pos, pad)
    got = _call(query, pool_k, pool_v, pos, pad, table)
    diff = float((want.float() - got.float()).abs().max())
    if dev != "cuda":  # a check of the set-up (TRITON_INTERPRET=1 on CPU): no timing
        return {"batch": batch, "context": context, "max_abs_diff": diff}
    slab_us = _time(lambda: _call(query, key, value, pos, pad), iters, repeats)
    paged_us = _time(lambda: _call(query, pool_k, pool_v, pos, pad, table), iters, repeats)
    read = 2 * batch * KV_HEADS * context * DIM * 2  # bytes of keys and values a call reads
    return {"batch": batch, "context": context, "slab_us": round(slab_us, 1), "paged_us": round(paged_us, 1),
            "paged_over_slab": round(paged_us / slab_us, 3), "slab_gb_s": round(read / slab_us / 1e3, 1),
            "paged_gb_s": round(read / paged_us / 1e3, 1), "max_abs_diff": diff}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--contexts", type=int, nargs="+", default=[4096, 32768])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    rows = []
    for n in args.contexts:
        for b in args.batches:
            rows.append(case(b, n, args.iters, args.repeats))
            torch.cuda.empty_cache()  # this case's caches go before the next one's
    gpu = torch.cuda.get_device_name().lower().replace(" ", "_")
    head = "| B | context | slab µs | paged µs | paged / slab | slab GB/s | paged GB/s | max abs diff |\n" \
           "|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    table = head + "".join(f"| {r['batch']} | {r['context']} | {r['slab_us']} | {r['paged_us']} | "
                           f"{r['paged_over_slab']} | {r['slab_gb_s']} | {r['paged_gb_s']} | "
                           f"{r['max_abs_diff']:.2e} |\n" for r in rows)
    md = (f"# Paged vs slab decode attention (one Qwen2-7B layer, bf16, split kernel), {gpu}\n\n"
          f"Blocks of {BLOCK_TOKENS} tokens in a shuffled order; median of {args.repeats} x {args.iters} calls.\n\n"
          + table)
    write_result(args.out_dir / f"paged_attention_{gpu}", {"env": environment(["cuda"]), "rows": rows}, md)
    print(table)


if __name__ == "__main__":
    main()
