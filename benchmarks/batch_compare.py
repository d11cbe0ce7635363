"""Compare batch_bench.py results (e.g. before/after an engine change): a markdown table and a plot.

    python benchmarks/batch_compare.py --runs "before=A.json" "after=B.json" --out benchmarks/results/NAME

For every batch size: per-batch wall seconds of each method in each run, and problems per second
(B / seconds; the toy pair's methods write different numbers of tokens, so tokens/s would
favour the verbose LLM).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def load(spec: str) -> tuple[str, dict]:
    label, path = spec.split("=", 1)
    return label, json.loads(Path(path).read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", nargs="+", required=True, help="LABEL=path/to/batch_bench.json")
    ap.add_argument("--methods", nargs="+", default=None, help="methods to show (default: all but specdec)")
    ap.add_argument("--shape", default=None, help="keep rows of this shape only (e.g. qwen2 or pair)")
    ap.add_argument("--out", required=True, help="output stem (.md and .png are added)")
    args = ap.parse_args()
    runs = [load(s) for s in args.runs]
    series: dict[str, dict[int, float]] = {}
    for label, data in runs:
        for r in data["rows"]:
            if "refused" in r or r["method"] == "specdec" or (args.methods and r["method"] not in args.methods) \
                    or (args.shape and r.get("shape") != args.shape):
                continue
            series.setdefault(f"{r['method']} ({label})", {})[r["batch"]] = r["seconds"]
    batches = sorted({b for s in series.values() for b in s})
    names = sorted(series)
    lines = [f"# Batched decoding: {', '.join(label for label, _ in runs)}\n",
             "Runs: " + "; ".join(f"{label}: {d['meta']['device']}, torch {d['meta']['torch']}, transformers "
                                  f"{d['meta']['transformers']}, {d['meta']['date']}" for label, d in runs) + ".\n",
             "Seconds per batch (every row waits for the batch); in brackets, problems per second.\n",
             "| B | " + " | ".join(names) + " |", "| ---: | " + " | ".join("---:" for _ in names) + " |"]
    for b in batches:
        cells = [f"{series[n][b]:.2f} ({b / series[n][b]:.1f})" if b in series[n] else "-" for n in names]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for n in names:
        bs = sorted(series[n])
        ax.plot(bs, [b / series[n][b] for b in bs], marker="o", label=n)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size B")
    ax.set_ylabel("problems per second (log; higher is better)")
    ax.set_title("Batched decoding" + (f" ({args.shape})" if args.shape else "") + ", " + runs[-1][1]["meta"]["device"])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
