"""Evaluate R-Stitch against LLM-only and SLM-only decoding on one benchmark, from Python.

    python examples/evaluate_benchmark.py --data /path/to/gsm8k.jsonl --limit 2            # shipped pair, CPU
    python examples/evaluate_benchmark.py --hub --data /path/to/math500.jsonl --limit 50 \
        --thresholds 0.02 0.03 --max-new-tokens 8192 --device cuda

The benchmark is a JSONL file with ``id``, ``problem`` and ``answer`` per line (the six sets of the
paper: AIME24, AMC23, GSM8K, MATH500, Minerva Math, OlympiadBench), a file in a published layout
(GSM8K's ``question`` / ``answer`` with ``#### N``, MATH-500's ``problem`` / ``answer`` / ``unique_id``,
recognised by their columns), or a Hub dataset id; ``--columns problem=question,answer=final_answer``
maps other column names. The
shipped toy pair only knows toy-world arithmetic and scores near zero on these: with it the run
checks the plumbing. Without ``--data`` it evaluates the toy pair's own test split instead.
``rstitch eval`` is the full CLI (specdec, random routing, the router, sharding, plots).
"""

from __future__ import annotations

import argparse
import sys

import hf_rstitch
from common import load_models
from hf_rstitch.eval import EvalConfig, evaluate


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(hf_rstitch.shipped("test")), help="benchmark JSONL, local file or Hub dataset id")
    parser.add_argument("--columns", default="", help="column mapping, e.g. problem=question,answer=final_answer")
    parser.add_argument("--limit", type=int, default=2, help="first N problems")
    parser.add_argument("--thresholds", type=float, nargs="+", default=[0.001])
    parser.add_argument("--max-new-tokens", type=int, default=300)
    parser.add_argument("--hub", action="store_true", help="the 7B / 1.5B Hub pair instead of the shipped one")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="runs/eval-example")
    args = parser.parse_args(argv)

    try:
        return run(args)
    except (ValueError, OSError, ImportError) as err:  # bad data, columns or model: say what, not a traceback
        message = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
        print(f"evaluate_benchmark.py: error: {message}", file=sys.stderr)
        raise SystemExit(2) from None


def run(args: argparse.Namespace) -> dict:
    from hf_rstitch.eval.data import load_problems

    load_problems(args.data, limit=1, columns=args.columns)  # a file the harness cannot read fails before loading
    llm, slm, tok = load_models(args.hub, args.device)
    cfg = EvalConfig(
        llm="hub-7b" if args.hub else "toy-llm", slm="hub-1.5b" if args.hub else "toy-slm", data=[args.data],
        columns=args.columns,
        methods=["llm", "slm", "rstitch"], thresholds=args.thresholds, limit=args.limit,
        max_new_tokens=args.max_new_tokens, device=args.device, out=args.out, resume=False, warmup=False,
        progress=False, plots=False,
        **({} if args.hub else {"instruction": ""}),  # the toy pair was trained without the instruction
    )
    summary = evaluate(cfg, llm=llm, slm=slm, tokenizer=tok)
    print(summary["table1_markdown"])
    return summary


if __name__ == "__main__":
    main()
