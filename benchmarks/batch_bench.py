"""Batched stitching benchmark (issue #8): per-sample latency and throughput vs batch size.

For each batch size B it times, on one device, with every row decoding exactly N new tokens
(EOS suppressed by min_new_tokens so rows do not finish early):

* LLM-only and SLM-only: plain batched ``generate`` (DynamicCache);
* stitched decoding on replayed per-row routes with a given LLM-token share (random-weight
  models have meaningless entropies, so the routes are synthetic: ``hf_rstitch.fast.routes.route``,
  seeded per row);
* speculative decoding (transformers' assisted generation) where transformers runs it (B = 1).

Per-sample latency = wall time of the batched call (every sample waits for the batch);
throughput = B * N / wall time. Prints a table; writes JSON + markdown under
benchmarks/results/.

    PYTHONPATH=. python benchmarks/batch_bench.py --shapes qwen2 --device cuda
    PYTHONPATH=. python benchmarks/batch_bench.py --shapes tiny --device cpu --batches 1 2 --new-tokens 8   # smoke
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

import torch
import transformers

import hf_rstitch
from lab import command, random_pair, share_route, timed

ROOT = Path(__file__).resolve().parent


def bench_pair(args, device: torch.device, rows: list[dict], save) -> list[dict]:
    """The shipped pair on real test problems with entropy routing (rows finish at their own EOS)."""
    from hf_rstitch.eval.batched import left_pad
    from hf_rstitch.eval.data import prompt_ids
    from hf_rstitch.toyworld.pair import load_pair, load_test_split

    llm, slm, tok = load_pair(str(device))
    problems = load_test_split()
    for batch in args.batches:
        chunk = problems[:batch]
        ids, mask = left_pad([prompt_ids(tok, r["problem"], instruction="") for r in chunk], tok.pad_token_id)
        ids, mask = ids.to(device), mask.to(device)
        kw = dict(attention_mask=mask, max_new_tokens=400, do_sample=False, pad_token_id=tok.pad_token_id)
        runs = {"llm": lambda: llm.generate(ids, **kw), "slm": lambda: slm.generate(ids, **kw)}
        for tau in args.thresholds:
            runs[f"stitch@{tau:g}"] = (lambda t=tau: llm.generate(ids, assistant_model=slm, stitch_threshold=t,
                                                                   stitch_engine="default", **kw))  # the eager lanes
        if batch == 1 and llm.config.vocab_size == slm.config.vocab_size:  # assisted generation needs one vocab
            runs["specdec"] = lambda: llm.generate(ids, assistant_model=slm, **kw)
        for name, fn in runs.items():
            out = fn()  # warm-up, and the token count
            new = int(((out[:, ids.shape[1]:] != tok.pad_token_id)).sum())
            seconds, _ = timed(fn, device, repeats=args.repeats)
            rows.append({"shape": "pair", "batch": batch, "method": name, "seconds": seconds,
                         "per_sample_latency_s": seconds, "throughput_tok_s": new / seconds,
                         "ms_per_step": 1000 * seconds / max(1, out.shape[1] - ids.shape[1])})
            save()
            print(f"pair  B={batch:3d} {name:12s} {seconds:8.3f}s  {new / seconds:9.1f} tok/s", file=sys.stderr,
                  flush=True)
    return rows


def bench_shape(shape: str, args, device: torch.device, rows: list[dict], save) -> list[dict]:
    dtype = getattr(torch, args.dtype)
    llm, slm = random_pair(shape, str(device), dtype)
    vocab = min(llm.config.vocab_size, slm.config.vocab_size)
    eos = llm.generation_config.eos_token_id
    common = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                  pad_token_id=0, eos_token_id=eos if eos is not None else 0)
    for batch in args.batches:
        g = torch.Generator().manual_seed(batch)
        ids = torch.randint(10, vocab - 10, (batch, args.prompt_len), generator=g).to(device)
        mask = torch.ones_like(ids)
        runs = {
            "llm": lambda: llm.generate(ids, attention_mask=mask, **common),
            "slm": lambda: slm.generate(ids, attention_mask=mask, **common),
        }
        for share in args.llm_shares:
            routes = [share_route(args.new_tokens, share, args.mean_segment, seed=1000 * batch + r) for r in range(batch)]
            policy = hf_rstitch.ReplayPolicy(routes)
            runs[f"stitch@{share:g}"] = (lambda p=policy: llm.generate(
                ids, attention_mask=mask, assistant_model=slm, stitch_policy=p, stitch_engine="default", **common))
        if batch == 1 and llm.config.vocab_size == slm.config.vocab_size:  # assisted generation needs one vocab
            runs["specdec"] = lambda: llm.generate(ids, attention_mask=mask, assistant_model=slm, **common)
        for name, fn in runs.items():
            fn()  # warm-up
            seconds, _ = timed(fn, device, repeats=args.repeats)
            row = {"shape": shape, "batch": batch, "method": name, "seconds": seconds,
                   "per_sample_latency_s": seconds, "throughput_tok_s": batch * args.new_tokens / seconds,
                   "ms_per_step": 1000 * seconds / args.new_tokens}
            rows.append(row)
            save()
            print(f"{shape:5s} B={batch:3d} {name:12s} {seconds:8.3f}s  {row['throughput_tok_s']:9.1f} tok/s  "
                  f"{row['ms_per_step']:7.2f} ms/step", file=sys.stderr, flush=True)
        if batch > 1:
            rows.append({"shape": shape, "batch": batch, "method": "specdec", "refused":
                         "transformers' assisted generation supports batch size 1 only"})
    del llm, slm
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"# Batched stitching: per-sample latency and throughput\n",
             f"Device: {meta['device']}; torch {meta['torch']}, transformers {meta['transformers']}; {meta['date']}. "
             f"Random-weight shapes: prompt {meta['prompt_len']} tokens, {meta['new_tokens']} new tokens per row, "
             "stitched rows replay synthetic routes (hf_rstitch.fast.routes.route) with the given LLM-token share. Shipped pair ('pair'): the first B "
             "test problems, up to 400 new tokens, rows stop at their own EOS, entropy routing at --thresholds; "
             "throughput counts generated tokens. Greedy, eager DynamicCache path.\n",
             "| shape | B | method | per-sample latency (s) | throughput (tok/s) | ms/step |",
             "| --- | ---: | --- | ---: | ---: | ---: |"]
    for r in rows:
        if "refused" in r:
            continue
        lines.append(f"| {r['shape']} | {r['batch']} | {r['method']} | {r['per_sample_latency_s']:.3f} | "
                     f"{r['throughput_tok_s']:.1f} | {r['ms_per_step']:.2f} |")
    lines.append("\nSpeculative decoding (transformers' assisted generation) is refused for B > 1; it is not run for the "
                 "random Qwen2 pair at all: the 7B and 1.5B shapes have different vocabulary sizes (152064 vs 151936), "
                 "which transformers takes for different tokenizers.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["qwen2"], choices=["tiny", "qwen2", "pair"],
                    help="tiny: in-process toy pair; qwen2: random-weight Qwen2 7B (LLM) + 1.5B (SLM), replayed "
                         "routes; pair: the shipped pair on test problems with entropy routing (--thresholds)")
    ap.add_argument("--thresholds", nargs="+", type=float, default=[0.0004], help="R-Stitch tau for --shapes pair")
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--llm-shares", nargs="+", type=float, default=[0.1, 0.3])
    ap.add_argument("--mean-segment", type=float, default=4.0, help="mean length of an LLM segment (tokens)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default=str(ROOT / "results" / "batch_bench"))
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "date": datetime.date.today().isoformat(), "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
            "llm_shares": args.llm_shares, "mean_segment": args.mean_segment, "dtype": args.dtype,
            "command": command()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []

    def save():  # after every measured row: a run cut short keeps what it measured
        out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
        out.with_suffix(".md").write_text(markdown(rows, meta))

    for shape in args.shapes:
        if shape == "pair":
            bench_pair(args, device, rows, save)
        else:
            bench_shape(shape, args, device, rows, save)
    save()
    print(markdown(rows, meta))
    print(json.dumps({"meta": meta, "n_rows": len(rows)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
