"""Threshold sweep: accuracy and LLM-token share of R-Stitch across tau, with a plot.

    python examples/threshold_sweep.py                                   # 20 toy test problems, 7 thresholds
    python examples/threshold_sweep.py --n 4 --thresholds 0.001 1 --max-new-tokens 200
    python examples/threshold_sweep.py --hub --data gsm8k.jsonl --n 50 --max-new-tokens 4096

Each tau decodes all problems as one left-padded batch (every row routes on its own). Writes
``OUT/sweep.json`` and ``OUT/sweep.png``. For timed, paper-style tables use ``rstitch eval``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import hf_rstitch  # noqa: F401  (registers stitched decoding on generate)
from common import load_models, prompt_ids


def problems(data: str | None, n: int) -> list[dict]:
    if data:
        from hf_rstitch.eval.data import load_problems

        return [{"problem": p.problem, "answer": p.answer} for p in load_problems(data, limit=n)]
    from hf_rstitch.toyworld import load_test_split

    return load_test_split()[:n]


def left_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, T]`` ids and mask, shorter prompts padded on the left."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def sweep(llm, slm, tok, rows: list[dict], thresholds: list[float], max_new_tokens: int, hub: bool = False) -> list[dict]:
    """One batched stitched generation per tau; accuracy and token shares per tau."""
    if hub:
        from hf_rstitch.eval.grading import grade

        def correct(text, answer):
            return grade(text, answer).correct
    else:
        from hf_rstitch.toyworld import grade as correct
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ids, mask = left_pad([prompt_ids(tok, r["problem"], hub) for r in rows], pad)
    ids, mask = ids.to(llm.device), mask.to(llm.device)
    results = []
    for tau in thresholds:
        out = llm.generate(ids, attention_mask=mask, assistant_model=slm, stitch_threshold=tau,
                           max_new_tokens=max_new_tokens, return_dict_in_generate=True)
        traces = out.stitch if isinstance(out.stitch, list) else [out.stitch]
        texts = tok.batch_decode(out.sequences[:, ids.shape[1]:], skip_special_tokens=True)
        right = [correct(t, r["answer"]) for t, r in zip(texts, rows)]
        tokens = sum(t.n_tokens for t in traces)
        results.append({
            "threshold": tau,
            "accuracy": 100.0 * sum(right) / len(rows),
            "llm_token_share": sum(t.llm_tokens for t in traces) / max(tokens, 1),
            "mean_new_tokens": tokens / len(rows),
            "mean_switches": sum(t.switches for t in traces) / len(rows),
        })
        print(f"tau={tau:<8g} accuracy={results[-1]['accuracy']:6.2f}%  "
              f"LLM share={results[-1]['llm_token_share']:.3f}  tokens={results[-1]['mean_new_tokens']:.1f}", flush=True)
    return results


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    taus = [max(r["threshold"], 1e-5) for r in results]  # tau = 0 drawn at the left edge of the log axis
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(taus, [r["accuracy"] for r in results], "o-", color="tab:blue", label="accuracy (%)")
    ax.set_xscale("log")
    ax.set_xlabel("threshold tau (normalized entropy)")
    ax.set_ylabel("accuracy (%)", color="tab:blue")
    share = ax.twinx()
    share.plot(taus, [r["llm_token_share"] for r in results], "s--", color="tab:red")
    share.set_ylabel("LLM-token share", color="tab:red")
    share.set_ylim(0, 1)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--thresholds", type=float, nargs="+", default=[0, 0.0003, 0.001, 0.003, 0.01, 0.05, 1])
    parser.add_argument("--n", type=int, default=20, help="problems (the first N)")
    parser.add_argument("--data", default=None, help="benchmark JSONL (default: the shipped pair's test split)")
    parser.add_argument("--max-new-tokens", type=int, default=300)
    parser.add_argument("--hub", action="store_true", help="use the 7B / 1.5B Hub pair instead of the shipped one")
    parser.add_argument("--out", default="runs/sweep")
    args = parser.parse_args(argv)

    llm, slm, tok = load_models(args.hub)
    results = sweep(llm, slm, tok, problems(args.data, args.n), args.thresholds, args.max_new_tokens, args.hub)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, out / "sweep.png")
    print(f"wrote {out / 'sweep.json'} and {out / 'sweep.png'}")
    return results


if __name__ == "__main__":
    main()
