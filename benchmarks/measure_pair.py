"""Measure the toy-world pair, each model alone, with plain greedy ``model.generate``.

Reports, on the held-out test split: accuracy of the LLM and of the SLM, their mean answer
lengths (generated tokens, EOS included) and the ratio SLM/LLM; and the per-token decode time
of each model on this machine (batch 1, median of several problems, after a warm-up). Prints a
table and writes one JSON document (device, versions, date, command, numbers).

    python benchmarks/measure_pair.py                      # shipped pair, CPU, full test split
    python benchmarks/measure_pair.py --llm runs/llm --slm runs/slm --device cuda --no-speed

Accuracy is measured with left-padded batches (``--batch-size``); the speed with batch 1.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
from pathlib import Path

from hf_rstitch.toyworld.pair import ASSETS
from lab import device_name, timed

REPO = Path(__file__).resolve().parents[1]

TARGETS = {"llm_accuracy_min": 0.90, "slm_accuracy_max": 0.75, "length_ratio_max": 0.6,
           "speed_ratio_min": 2.0}


def from_records(folder: Path, rows: list[dict], method: str) -> dict:
    """``evaluate``-shaped results of ``method`` (llm / slm) from an eval run's records.jsonl."""
    found = {}
    if not (folder / "records.jsonl").exists():
        raise SystemExit(f"{folder}/records.jsonl is missing: the repository keeps eval summaries only; regenerate "
                         f"the records with the `rstitch eval` command in {folder}/README.md (--out {folder})")
    for line in (folder / "records.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line) if line.strip() else {}
        if record.get("method") == method:
            found[str(record["id"])] = record
    missing = [r["id"] for r in rows if str(r["id"]) not in found]
    if missing:
        raise SystemExit(f"{folder}/records.jsonl has no {method!r} record for {len(missing)} problems "
                         f"(first: {missing[0]}); run `rstitch eval` with --methods llm slm on the same data")
    results = [{"correct": bool(found[str(r["id"])]["correct"]),
                "tokens": found[str(r["id"])]["new_tokens"]} for r in rows]
    n = len(results)
    return {"accuracy": sum(r["correct"] for r in results) / n,
            "mean_tokens": sum(r["tokens"] for r in results) / n, "seconds": 0.0, "results": results}


def per_token_ms(model, tokenizer, problems: list[str], new_tokens: int) -> float:
    """Median ms per generated token at batch 1 (fixed length: min_new_tokens = max)."""
    import torch

    from hf_rstitch.toyworld.tokenizer import prompt_text

    times = []
    for i, problem in enumerate(problems):
        enc = tokenizer(prompt_text(tokenizer, problem), return_tensors="pt", add_special_tokens=False)
        enc = {k: v.to(model.device) for k, v in enc.items()}
        with torch.inference_mode():
            seconds, _ = timed(lambda: model.generate(**enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                                      do_sample=False, pad_token_id=tokenizer.pad_token_id),
                               model.device)
            if i:  # the first is the warm-up
                times.append(seconds * 1000 / new_tokens)
    return statistics.median(times)


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llm", default=str(ASSETS / "llm"), help="LLM folder")
    p.add_argument("--slm", default=str(ASSETS / "slm"), help="SLM folder")
    p.add_argument("--data", default=str(ASSETS / "test.jsonl"), help="test split JSONL")
    p.add_argument("--n", type=int, default=0, help="first N problems only (0 = all)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--batch-size", type=int, default=64, help="problems per accuracy batch")
    p.add_argument("--max-new-tokens", type=int, default=400, help="generation cap")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = default)")
    p.add_argument("--accuracy-from", default="",
                   help="take accuracy and answer lengths from the records.jsonl of an `rstitch eval` run "
                        "with methods llm and slm on the same data (batch 1, greedy) instead of decoding "
                        "the split again here; only the per-token timing runs")
    p.add_argument("--speed-threads", type=int, default=0,
                   help="torch CPU threads for the batch-1 timing only (0 = same as --threads); lets the "
                        "batched accuracy pass use every core while the timing matches one-thread runs")
    p.add_argument("--speed-problems", type=int, default=6, help="problems timed at batch 1")
    p.add_argument("--speed-tokens", type=int, default=128, help="tokens generated per timing")
    p.add_argument("--no-speed", action="store_true", help="skip the per-token timing")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "toyworld_pair.json"))
    return p.parse_args(argv)


def measure_model(role: str, folder: str, rows: list[dict], tok, args) -> dict:
    """Accuracy (by level), mean answer length and, unless --no-speed, batch-1 ms per token of one model."""
    import torch
    from transformers import AutoModelForCausalLM

    from hf_rstitch.toyworld.evaluate import evaluate

    if args.threads:
        torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(args.device).eval()
    if args.accuracy_from:
        ev = from_records(Path(args.accuracy_from), rows, role)
    else:
        ev = evaluate(model, tok, rows, args.batch_size, args.max_new_tokens,
                      progress=lambda d, t, r=role: print(f"\r{r}: {d}/{t}", end="", file=sys.stderr))
        print(file=sys.stderr)
    by_level: dict[str, list[bool]] = {}
    for row, res in zip(rows, ev["results"]):
        by_level.setdefault(str(row.get("level")), []).append(res["correct"])
    out = {"folder": str(folder), "params": sum(p.numel() for p in model.parameters()),
           "accuracy": ev["accuracy"], "mean_tokens": ev["mean_tokens"],
           "accuracy_by_level": {k: sum(v) / len(v) for k, v in sorted(by_level.items())},
           "eval_seconds": ev["seconds"]}
    if not args.no_speed:
        if args.speed_threads:
            torch.set_num_threads(args.speed_threads)
        out["ms_per_token_batch1"] = per_token_ms(model, tok, [r["problem"] for r in rows[:args.speed_problems + 1]],
                                                  args.speed_tokens)
    return out


def judge(report: dict, no_speed: bool) -> None:
    """Ratios and which targets are met, added to ``report``."""
    llm, slm = report["llm"], report["slm"]
    report["length_ratio_slm_over_llm"] = slm["mean_tokens"] / llm["mean_tokens"]
    if not no_speed:
        report["speed_ratio_llm_over_slm"] = llm["ms_per_token_batch1"] / slm["ms_per_token_batch1"]
    report["targets_met"] = {
        "llm_accuracy": llm["accuracy"] >= TARGETS["llm_accuracy_min"],
        "slm_accuracy": slm["accuracy"] <= TARGETS["slm_accuracy_max"],
        "length_ratio": report["length_ratio_slm_over_llm"] <= TARGETS["length_ratio_max"],
        **({"speed_ratio": report["speed_ratio_llm_over_slm"] >= TARGETS["speed_ratio_min"]} if not no_speed else {}),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import tokenizers
    import torch
    import transformers
    from transformers import AutoTokenizer

    from hf_rstitch.toyworld.tasks import read_jsonl

    if args.threads:
        torch.set_num_threads(args.threads)
    rows = read_jsonl(args.data)
    rows = rows[:args.n] if args.n else rows
    tok = AutoTokenizer.from_pretrained(args.llm)
    report: dict = {"device": device_name(args.device), "n_problems": len(rows),
                    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "command": "python " + " ".join([sys.argv[0]] + (argv or sys.argv[1:])),
                    "versions": {"python": platform.python_version(), "torch": torch.__version__,
                                 "transformers": transformers.__version__,
                                 "tokenizers": tokenizers.__version__},
                    "decoding": (f"greedy, batch 1, from {args.accuracy_from}/records.jsonl"
                                 if args.accuracy_from else "greedy, plain model.generate, float32, "
                                 f"left-padded batches of {args.batch_size}"), "targets": TARGETS}
    for role, folder in (("llm", args.llm), ("slm", args.slm)):
        report[role] = measure_model(role, folder, rows, tok, args)
    judge(report, args.no_speed)
    print(f"{'model':<5} {'params':>9} {'accuracy':>9} {'mean tokens':>12} {'ms/token':>9}")
    for role in ("llm", "slm"):
        r = report[role]
        ms = f"{r['ms_per_token_batch1']:.2f}" if "ms_per_token_batch1" in r else "-"
        print(f"{role:<5} {r['params']:>9,} {r['accuracy']:>9.3f} {r['mean_tokens']:>12.1f} {ms:>9}")
    print(f"length ratio SLM/LLM {report['length_ratio_slm_over_llm']:.3f}; "
          f"speed ratio LLM/SLM {report.get('speed_ratio_llm_over_slm', float('nan')):.2f}; "
          f"device {report['device']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("targets_met",)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
