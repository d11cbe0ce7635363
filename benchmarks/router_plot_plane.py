"""Accuracy vs predicted latency (L_hat, ms) of R-Stitch thresholds and R-Stitch+ from sweep.json;
prints a markdown table with a dominance check and writes plane.png.

    python benchmarks/router_plot_plane.py [FOLDER]   # FOLDER holds sweep.json; default: results/router_pair_stage2
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parent / "results" / "router_pair_stage2"


def dominated_by(point: dict, curve: dict) -> list[str]:
    """Threshold points at least as accurate and at least as fast, one of them strictly."""
    return [tau for tau, q in curve.items()
            if q["accuracy"] >= point["accuracy"] and q["latency_ms"] <= point["latency_ms"]
            and (q["accuracy"] > point["accuracy"] or q["latency_ms"] < point["latency_ms"])]


def main() -> None:
    sweep = json.loads((HERE / "sweep.json").read_text())
    curve, router = sweep["rstitch"], sweep["router"]
    print(f"device {sweep['device']}, n = {sweep['n_test']} test problems, greedy, batched stitched decoding")
    print("| method | tau | accuracy | L_hat (ms) | LLM-token share | new tokens | dominated by |")
    print("|---|---|---|---|---|---|---|")
    for name, pts in (("R-Stitch", curve), ("R-Stitch+", router)):
        for tau, p in pts.items():
            dom = dominated_by(p, curve) if name == "R-Stitch+" else []
            print(f"| {name} | {float(tau):g} | {100 * p['accuracy']:.2f} | {p['latency_ms']:.1f} | "
                  f"{p['llm_token_share']:.3f} | {p['new_tokens']:.1f} | "
                  f"{', '.join(f'{float(t):g}' for t in dom) or ('none' if name == 'R-Stitch+' else '')} |")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    pts = sorted((p["latency_ms"], 100 * p["accuracy"], float(t)) for t, p in curve.items())
    ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], "o-", color="tab:red", label="R-Stitch (tau sweep)")
    for x, y, t in pts:
        ax.annotate(f"{t:g}", (x, y), textcoords="offset points", xytext=(3, -10), fontsize=7)
    rp = sorted((p["latency_ms"], 100 * p["accuracy"], float(t)) for t, p in router.items())
    ax.plot([x for x, _, _ in rp], [y for _, y, _ in rp], "*", ms=11, color="tab:blue",
            label="R-Stitch+ (router gated at tau)")
    for x, y, t in rp:
        ax.annotate(f"{t:g}", (x, y), textcoords="offset points", xytext=(3, 4), fontsize=7, color="tab:blue")
    ax.set_xscale("log")
    ax.set_xlabel("predicted latency L_hat per problem (ms, Eq. 4 profile, H200)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"toy pair, {sweep['n_test']} test problems, greedy")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(HERE / "plane.png", dpi=120)


if __name__ == "__main__":
    main()
