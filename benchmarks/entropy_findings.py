"""The seed paper's entropy findings, measured on the shipped pair from an evaluation run.

Reads an eval folder made with ``--save-traces`` that includes ``rstitch@1`` (the SLM alone,
with its per-token entropies) and ``rstitch@0`` (the LLM alone) and reports:

* the share of SLM tokens whose normalized entropy exceeds 0.1 (paper, AMC: 10.65 %);
* the mean SLM entropy over incorrect vs correct SLM traces (paper: higher when incorrect);
* the SLM's entropy at the first token of its own trace where the LLM, fed the same prefix
  (teacher forcing), would pick another token (past the opening token, where the two always
  differ by style), and over the 5 tokens up to it, against the mean
  over all SLM tokens; plus the token-level consistency (share of SLM tokens the LLM agrees with).

    python benchmarks/entropy_findings.py benchmarks/results/eval_toyworld_gpu_600_v2 --out benchmarks/results/toyworld_entropy.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_rstitch.eval.data import prompt_ids

ROOT = Path(__file__).resolve().parent.parent


def load(folder: Path) -> dict[str, dict[str, dict]]:
    by_method: dict[str, dict[str, dict]] = {}
    for line in (folder / "records.jsonl").read_text().splitlines():
        r = json.loads(line)
        by_method.setdefault(r["method"], {})[str(r["id"])] = r
    return by_method


def mean(xs):
    return statistics.fmean(xs) if xs else float("nan")


@torch.no_grad()
def llm_choices(llm, tokenizer, problem: str, output: str) -> tuple[list[int], list[int]]:
    """(SLM tokens, the LLM's greedy choice at each of those positions given the same prefix)."""
    prompt = prompt_ids(tokenizer, problem, instruction="")
    new = tokenizer(output, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt + new])
    logits = llm(input_ids=ids).logits[0, len(prompt) - 1: -1]
    return new, logits.argmax(-1).tolist()


def findings(folder: Path, tokenizer, llm, problems: dict[str, str]) -> dict:
    recs = load(folder)
    slm = recs.get("rstitch@1")
    if not slm or "trace" not in next(iter(slm.values())):
        raise SystemExit(f"{folder} needs method rstitch@1 (the SLM alone) recorded with --save-traces")
    all_h = [h for r in slm.values() for h in r["trace"]["entropies"]]
    correct = [mean(r["trace"]["entropies"]) for r in slm.values() if r["correct"]]
    wrong = [mean(r["trace"]["entropies"]) for r in slm.values() if not r["correct"]]
    at_split, before_split, agree, total = [], [], 0, 0
    for pid, s in slm.items():
        a, b = llm_choices(llm, tokenizer, problems[pid], s["output"])
        agree += sum(x == y for x, y in zip(a, b))
        total += len(a)
        # position 0 is the style choice (the LLM opens verbose, the SLM concise): look past it
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y and i > 0), None)
        ent = s["trace"]["entropies"]
        if first is None or first >= len(ent):
            continue
        at_split.append(ent[first])
        before_split.extend(ent[max(0, first - 5): first + 1])
    return {
        "slm_tokens": len(all_h),
        "share_slm_tokens_entropy_gt_0.1": sum(h > 0.1 for h in all_h) / len(all_h),
        "share_slm_tokens_entropy_eq_0": sum(h == 0 for h in all_h) / len(all_h),
        "mean_slm_entropy_correct_traces": mean(correct),
        "mean_slm_entropy_incorrect_traces": mean(wrong),
        "n_correct_traces": len(correct), "n_incorrect_traces": len(wrong),
        "mean_slm_entropy_all_tokens": mean(all_h),
        "mean_slm_entropy_at_first_disagreement": mean(at_split),
        "mean_slm_entropy_window_up_to_first_disagreement": mean(before_split),
        "n_disagreements": len(at_split),
        "token_consistency_llm_vs_slm": agree / max(total, 1),
        "paper": {"share_gt_0.1": 0.1065, "finding": "higher entropy in incorrect traces and before harmful tokens"},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--llm", default=str(ROOT / "hf_rstitch" / "assets" / "pair" / "llm"))
    ap.add_argument("--data", default=str(ROOT / "hf_rstitch" / "assets" / "pair" / "test.jsonl"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    problems = {str(json.loads(l)["id"]): json.loads(l)["problem"] for l in open(args.data) if l.strip()}
    llm = AutoModelForCausalLM.from_pretrained(args.llm, dtype=torch.float32).eval()
    result = findings(args.folder, AutoTokenizer.from_pretrained(args.llm), llm, problems)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
