"""Accuracy and token counts of R-Stitch on the shipped pair's whole test split, decoded in batches.

Batched stitching gives every row the same tokens as decoding it alone (tests/engine/test_batch.py),
so accuracy and per-model token counts over all 600 problems come from batched runs here; latency
is measured separately at batch size 1 (``rstitch eval``), where it means what the paper means.

    OMP_NUM_THREADS=2 python scripts/stitch_accuracy_batched.py --thresholds 0.0003 0.0005 \
        --out benchmarks/results/toyworld_stitch_accuracy.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time

import torch
import transformers

import hf_rstitch  # noqa: F401
from hf_rstitch.eval.data import prompt_ids
from hf_rstitch.router.rollout import left_pad
from hf_rstitch.toyworld.pair import grade, load_pair, load_test_split


def run(llm, slm, tok, rows, tau, batch):
    correct = llm_tok = slm_tok = switches = 0
    for start in range(0, len(rows), batch):
        chunk = rows[start:start + batch]
        ids, mask = left_pad([prompt_ids(tok, r["problem"], instruction="") for r in chunk], tok.pad_token_id)
        kw = dict(attention_mask=mask, max_new_tokens=400, do_sample=False, pad_token_id=tok.pad_token_id,
                  return_dict_in_generate=True)
        if tau is None:
            out, traces = llm.generate(ids, **kw), None
        else:
            out = llm.generate(ids, assistant_model=slm, stitch_threshold=tau, **kw)
            traces = out.stitch if isinstance(out.stitch, list) else [out.stitch]
        for i, r in enumerate(chunk):
            text = tok.decode(out.sequences[i, ids.shape[1]:], skip_special_tokens=True)
            correct += grade(text, r["answer"])
            if traces:
                llm_tok += traces[i].llm_tokens
                slm_tok += traces[i].slm_tokens
                switches += traces[i].switches
        print(f"  tau={tau} {start + len(chunk)}/{len(rows)}", file=sys.stderr, flush=True)
    n = len(rows)
    return {"threshold": tau, "n": n, "accuracy": correct / n, "llm_tokens": llm_tok / n, "slm_tokens": slm_tok / n,
            "switches": switches / n}


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
    results = []
    for tau in ([None] if args.llm_only else []) + args.thresholds:
        t0 = time.perf_counter()
        res = run(llm, slm, tok, rows, tau, args.batch)
        res["wall_s_batched"] = time.perf_counter() - t0
        results.append(res)
        print(json.dumps(res), flush=True)
    doc = {"data": args.data or "hf_rstitch/assets/pair/test.jsonl", "device": "cpu", "torch": torch.__version__, "transformers": transformers.__version__,
           "date": datetime.date.today().isoformat(), "batch": args.batch, "results": results,
           "command": "python scripts/stitch_accuracy_batched.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
