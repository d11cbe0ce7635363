"""Batched stitching on the shipped pair (issue #8): per-sample latency and throughput vs batch size.

For each batch size B, the first B test problems, rows stopping at their own EOS, greedy, the eager
engine (plain ``generate`` and its DynamicCache): the LLM alone, the SLM alone, stitched decoding with
entropy routing at each of ``--thresholds``, and speculative decoding (transformers' assisted
generation) where transformers runs it (B = 1). Per-sample latency = wall time of the batched call
(every sample waits for the batch); throughput = generated tokens / wall time. Prints a table; writes
JSON + markdown under benchmarks/results/.

    PYTHONPATH=. python benchmarks/batch_bench.py --device cpu --batches 1 2 4 8 16 32 --thresholds 0.005

The engine's speed per batch on model shapes (random weights, B = 1-256, against the bandwidth floor) is
``engine_batched.py``'s question. The eager engine on random Qwen2 shapes (``--shapes qwen2``,
``batch_bench_nvidia_h200*.md``) was measured by this script at commit 93adabb (``git show
93adabb:benchmarks/batch_bench.py``).
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

import hf_rstitch  # noqa: F401  (patches generate)
from lab import command, timed

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


def markdown(rows: list[dict], meta: dict) -> str:
    lines = ["# Batched stitching: per-sample latency and throughput\n",
             f"Device: {meta['device']}; torch {meta['torch']}, transformers {meta['transformers']}; {meta['date']}. "
             "Shipped pair ('pair'): the first B test problems, up to 400 new tokens, rows stop at their own EOS, "
             "entropy routing at --thresholds; throughput counts generated tokens. Greedy, eager DynamicCache path.\n",
             "| shape | B | method | per-sample latency (s) | throughput (tok/s) | ms/step |",
             "| --- | ---: | --- | ---: | ---: | ---: |"]
    for r in rows:
        if "refused" in r:
            continue
        lines.append(f"| {r['shape']} | {r['batch']} | {r['method']} | {r['per_sample_latency_s']:.3f} | "
                     f"{r['throughput_tok_s']:.1f} | {r['ms_per_step']:.2f} |")
    lines.append("\nSpeculative decoding (transformers' assisted generation) runs at B = 1 only.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["pair"], choices=["pair"],
                    help="pair: the shipped pair on test problems with entropy routing (the one left; kept for the "
                         "results' commands)")
    ap.add_argument("--thresholds", nargs="+", type=float, default=[0.005], help="R-Stitch tau")
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=str(ROOT / "results" / "batch_bench"))
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "date": datetime.date.today().isoformat(), "command": command()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []

    def save():  # after every measured row: a run cut short keeps what it measured
        out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
        out.with_suffix(".md").write_text(markdown(rows, meta))

    bench_pair(args, device, rows, save)
    save()
    print(markdown(rows, meta))
    print(json.dumps({"meta": meta, "n_rows": len(rows)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
