"""Accuracy and token counts of R-Stitch on the shipped pair's whole test split, decoded in batches.

Batched stitching gives every row the same tokens as decoding it alone (tests/decode/test_batch.py),
so accuracy and per-model token counts over all 600 problems come from batched runs
(``hf_rstitch.eval.sweep``); latency is measured separately at batch size 1 (``rstitch eval``),
where it means what the paper means.

    OMP_NUM_THREADS=2 PYTHONPATH=. python benchmarks/stitch_accuracy_batched.py --thresholds 0.0003 0.0005 \
        --out benchmarks/results/toyworld_valid_threshold_sweep_stage2.json --data VALID.jsonl --llm-only
"""

from __future__ import annotations

import argparse
import sys
import time

from hf_rstitch.eval import sweep
from hf_rstitch.toyworld.pair import load_pair, load_test_split
from lab import environment, write_result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--thresholds", nargs="+", type=float, default=[0.0003, 0.0005])
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--data", default=None,
                    help="JSONL of problems (default: the shipped test split); e.g. a valid split from "
                         "`rstitch toyworld data --split valid`, to choose a threshold without the test split")
    ap.add_argument("--pair", default=None,
                    help="folder with llm/, slm/ and test.jsonl (default: the shipped pair)")
    ap.add_argument("--llm-only", action="store_true", help="also run the LLM alone (threshold 'none')")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    llm, slm, tok = load_pair(root=args.pair) if args.pair else load_pair()
    if args.data:
        from hf_rstitch.toyworld.tasks import read_jsonl

        rows = read_jsonl(args.data)[: args.limit]
    else:
        rows = (load_test_split(args.pair) if args.pair else load_test_split())[: args.limit]
    t0 = time.perf_counter()
    summary = sweep(llm, slm, tok, rows, args.thresholds, methods=(["llm"] if args.llm_only else []) + ["rstitch"],
                    batch_size=args.batch, log=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    results = [{"threshold": r["param"], "n": r["n"], "accuracy": r["accuracy"], "llm_tokens": r["llm_tokens"],
                "slm_tokens": r["slm_tokens"], "switches": r["switches"], "wall_s_batched": r["wall_s"]}
               for r in summary]
    for r in results:
        print(r, flush=True)
    if args.out:
        write_result(args.out.removesuffix(".json"), {**environment(["cpu"]), "batch": args.batch, "results": results,
                                                      "data": args.data or "hf_rstitch/assets/pair/test.jsonl",
                                                      "seconds": time.perf_counter() - t0})
    return 0


if __name__ == "__main__":
    sys.exit(main())
