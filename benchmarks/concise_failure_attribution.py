"""Whose error is a failed stitched answer that stayed in the SLM's concise style?

For each problem: R-Stitch at ``--tau`` (greedy); traces the LLM opened (verbose) are skipped; for
the rest, the LLM alone answering with the concise opening word given. Counts problems where both
are right, only the stitched answer fails (an SLM error the threshold let through), only the LLM
alone fails, or both fail (the LLM's own concise error). Writes JSON.

    python benchmarks/concise_failure_attribution.py --llm LLM_DIR --data valid600.jsonl --n 200 --tau 0.001 \\
        --out benchmarks/results/toyworld_concise_attribution_stage1.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import transformers

REPO = Path(__file__).resolve().parents[1]

import hf_rstitch  # noqa: F401  (stitched generate)
from hf_rstitch.toyworld.pair import ASSETS, grade
from hf_rstitch.toyworld.tasks import opening_word, read_jsonl
from hf_rstitch.toyworld.tokenizer import prompt_text


def classify(llm, slm, tok, row: dict, tau: float) -> str | None:
    """``"both"`` / ``"stitch_only_wrong"`` / ``"llm_only_wrong"`` / ``"both_wrong"``, or ``None``
    when the stitched trace opened verbose."""
    prompt = prompt_text(tok, row["problem"])
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    out = llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=slm, stitch_threshold=tau,
                       max_new_tokens=400, do_sample=False)
    new = out[0, ids.shape[1]:].tolist()
    if tok.decode(new[:1]).strip() == opening_word("verbose"):
        return None
    opened = tok(prompt + opening_word("concise"), return_tensors="pt", add_special_tokens=False).input_ids
    alone = llm.generate(opened, attention_mask=torch.ones_like(opened), max_new_tokens=120, do_sample=False)
    ok_stitch = grade(tok.decode(new), row["answer"])
    ok_llm = grade(tok.decode(alone[0, opened.shape[1]:]), row["answer"])
    if ok_stitch and ok_llm:
        return "both"
    return "stitch_only_wrong" if ok_llm else "llm_only_wrong" if ok_stitch else "both_wrong"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llm", default=str(ASSETS / "llm"))
    ap.add_argument("--slm", default=str(ASSETS / "slm"))
    ap.add_argument("--data", required=True, help="JSONL of problems (e.g. a valid split)")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--tau", type=float, default=0.001)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    tok = transformers.AutoTokenizer.from_pretrained(args.llm)
    load = lambda d: transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()  # noqa: E731
    llm, slm = load(args.llm), load(args.slm)
    counts = {"concise_traces": 0, "verbose_traces": 0, "both": 0, "stitch_only_wrong": 0,
              "llm_only_wrong": 0, "both_wrong": 0}
    rows = read_jsonl(args.data)[:args.n]
    for i, row in enumerate(rows):
        kind = classify(llm, slm, tok, row, args.tau)
        counts["verbose_traces" if kind is None else "concise_traces"] += 1
        if kind:
            counts[kind] += 1
        print(f"\r{i + 1}/{len(rows)}", end="", file=sys.stderr)
    print(file=sys.stderr)
    report = {"llm": args.llm, "slm": args.slm, "data": args.data, "n": len(rows), "tau": args.tau,
              "counts": counts, "device": "cpu", "torch": torch.__version__,
              "transformers": transformers.__version__,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": "python " + " ".join([sys.argv[0]] + (argv or sys.argv[1:]))}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
