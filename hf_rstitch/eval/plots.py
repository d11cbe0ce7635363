"""Matplotlib figures in the paper's style (Agg backend; files only, no display).

* :func:`plot_tradeoff` -- accuracy vs latency per dataset (paper Figure 4): R-Stitch across
  thresholds and random routing across p as lines, LLM-only / SLM-only / SpecDec / router
  as single markers.
* :func:`plot_per_sample` -- one bar per problem with its speedup over LLM-only, coloured by
  the correctness of (LLM-only, method), a dashed line at 1x and the per-sample token
  reduction % as a black line with hollow circles on a second axis (paper Figure 5).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _plt() -> Any:
    try:
        import matplotlib
    except ImportError as err:
        from ..extras import install_hint

        raise ImportError(f"plots need matplotlib: {install_hint('eval', ('matplotlib',))}, or pass --no-plots."
                          ) from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


FIXED_STYLE = {"llm": ("*", "black", 14), "slm": ("s", "tab:blue", 9), "specdec": ("^", "tab:green", 10),
               "router": ("D", "tab:purple", 9)}
LINE_STYLE = {"rstitch": ("o", "tab:red", "-"), "speculate": ("v", "tab:orange", ":"),
              "random": ("x", "tab:gray", "--")}
LINE_LABEL = {"rstitch": "R-Stitch (τ)", "speculate": "R-Stitch + speculation (τ)", "random": "Random routing (p)"}


def plot_tradeoff(agg: dict[str, dict[str, dict[str, Any]]], path: str | Path) -> Path:
    """Accuracy (%) vs mean latency (s), one panel per dataset."""
    plt = _plt()
    datasets = list(agg)
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.2 * len(datasets), 3.6), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        stats = agg[ds]
        for kind, (marker, color, ls) in LINE_STYLE.items():
            pts = sorted((s["latency_s"], s["acc"], s["param"]) for s in stats.values() if s["kind"] == kind)
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color, ls=ls, label=LINE_LABEL[kind])
            for x, y, prm in pts:
                ax.annotate(f"{prm:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color=color)
        for name, s in stats.items():
            if s["kind"] in FIXED_STYLE:
                marker, color, size = FIXED_STYLE[s["kind"]]
                ax.plot([s["latency_s"]], [s["acc"]], marker=marker, color=color, ms=size, ls="", label=s["label"])
        ax.set_title(f"{ds} (n={next(iter(stats.values()))['n']})")
        ax.set_xlabel("latency per sample (s)")
        ax.set_ylabel("accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="best")
    fig.tight_layout()
    return _save(fig, plt, path)


OUTCOME_COLORS = {(True, True): ("tab:green", "both correct"), (True, False): ("tab:red", "LLM ✓, method ✗"),
                  (False, True): ("tab:blue", "LLM ✗, method ✓"), (False, False): ("tab:gray", "both wrong")}


def plot_per_sample(records: list[dict[str, Any]], dataset: str, method: str, path: str | Path) -> Path | None:
    """Per-problem speedup of ``method`` over LLM-only on ``dataset``; ``None`` without a baseline."""
    base = {str(r["id"]): r for r in records if r["dataset"] == dataset and r["method"] == "llm"}
    rows = [r for r in records if r["dataset"] == dataset and r["method"] == method and str(r["id"]) in base]
    if not rows:
        return None
    plt = _plt()
    pairs = [(base[str(r["id"])], r) for r in rows]
    pairs.sort(key=lambda p: p[0]["latency_s"] / max(p[1]["latency_s"], 1e-12), reverse=True)
    speedups = [b["latency_s"] / max(r["latency_s"], 1e-12) for b, r in pairs]
    reductions = [100.0 * (b["new_tokens"] - r["new_tokens"]) / max(b["new_tokens"], 1) for b, r in pairs]
    colors = [OUTCOME_COLORS[(bool(b["correct"]), bool(r["correct"]))][0] for b, r in pairs]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.12 * len(pairs) + 2), 3.6))
    xs = list(range(len(pairs)))
    ax.bar(xs, speedups, color=colors, width=0.85)
    ax.axhline(1.0, color="black", ls="--", lw=1)
    ax.set_xlabel("sample (sorted by speedup)")
    ax.set_ylabel("speedup vs LLM-only (×)")
    ax.set_title(f"{dataset}: {rows[0].get('label', method)} per sample")
    ax2 = ax.twinx()
    ax2.plot(xs, reductions, color="black", marker="o", mfc="none", ms=4, lw=1)
    ax2.set_ylabel("token reduction vs LLM-only (%)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c, _ in OUTCOME_COLORS.values()]
    ax.legend(handles, [t for _, t in OUTCOME_COLORS.values()], fontsize=7, loc="upper right")
    fig.tight_layout()
    return _save(fig, plt, path)


def _save(fig: Any, plt: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
