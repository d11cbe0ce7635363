"""Tables and the JSON summary, computed from records alone (no models needed).

Per dataset, every method is scored on the problems that *all* methods finished, so a
partly finished run still compares like with like. Metrics follow the paper: accuracy (%),
mean latency per sample (s), speedup = Lat(LLM-only) / Lat(method), mean LLM / SLM / total
new tokens, token reduction % vs LLM-only (positive = fewer tokens), mean switches.
"""

from __future__ import annotations

import json
import platform
import re
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..resources import reference
from .grading import grade, profile_for

KIND_ORDER = {"slm": 0, "llm": 1, "specdec": 2, "rstitch": 3, "speculate": 3, "router": 4, "random": 5}


def method_sort_key(name: str) -> tuple[int, float, str]:
    """``llm``, ``rstitch@0.02``, ``router-<fingerprint>@0.001``: kind order, then parameter."""
    head, _, param = name.partition("@")
    try:
        value = float(param) if param else 0.0
    except ValueError:
        value = 0.0
    return KIND_ORDER.get(head.partition("-")[0], 9), value, head


def safe_file_name(text: str) -> str:
    """``text`` as one file name: anything but letters, digits and ``._@+=-`` becomes ``_``, so a
    dataset or method name from a records file (``../../x``, ``owner/name``) cannot leave its folder."""
    name = re.sub(r"[^A-Za-z0-9._@+=-]", "_", text)
    return name if name.strip(".") else name.replace(".", "_")


def regrade(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records with ``correct``/``extracted`` recomputed from the stored output text."""
    out = []
    for r in records:
        g = grade(r["output"], r["answer"], profile_for(r["dataset"]))
        out.append({**r, "correct": g.correct, "extracted": g.extracted, "extracted_by": g.extracted_by})
    return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def aggregate(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{dataset: {method: stats}}`` over the ids every method of that dataset finished."""
    by_ds: dict[str, dict[str, dict[str, dict]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        by_ds[r["dataset"]][r["method"]][str(r["id"])] = r
    result: dict[str, dict[str, dict[str, Any]]] = {}
    for ds, by_method in by_ds.items():
        common = set.intersection(*(set(v) for v in by_method.values()))
        stats: dict[str, dict[str, Any]] = {}
        for name in sorted(by_method, key=method_sort_key):
            rows = [by_method[name][i] for i in sorted(common)]
            first = rows[0] if rows else next(iter(by_method[name].values()))
            stats[name] = {
                "label": first.get("label", name), "kind": first.get("kind"), "param": first.get("param"),
                "n": len(rows), "n_done": len(by_method[name]),
                "acc": 100.0 * _mean([float(r["correct"]) for r in rows]),
                "latency_s": _mean([r["latency_s"] for r in rows]),
                "llm_tokens": _mean([r["llm_tokens"] for r in rows]),
                "slm_tokens": _mean([r["slm_tokens"] for r in rows]),
                "total_tokens": _mean([r["new_tokens"] for r in rows]),
                "switches": _mean([r["switches"] for r in rows]),
                "truncated_pct": 100.0 * _mean([float(r.get("truncated", False)) for r in rows]),
            }
        base = stats.get("llm")
        for s in stats.values():
            s["speedup"] = base["latency_s"] / s["latency_s"] if base and s["latency_s"] > 0 else None
            s["token_reduction_pct"] = (100.0 * (base["total_tokens"] - s["total_tokens"]) / base["total_tokens"]
                                        if base and base["total_tokens"] > 0 else None)
        result[ds] = stats
    return result


def _f(x: Any, fmt: str = "{:.2f}", none: str = "--") -> str:
    return none if x is None or x != x else fmt.format(x)


def _param(s: dict[str, Any]) -> str:
    if s["param"] is None:
        return "--"
    short = f"{s['param']:g}"
    return short if float(short) == s["param"] else repr(float(s["param"]))


def md_cell(text: Any) -> str:
    """Text from a records file as one Markdown table cell: no row or column breaks, no raw HTML."""
    text = " ".join(str(text).split())
    for raw, safe in (("\\", "\\\\"), ("|", "\\|"), ("<", "&lt;"), (">", "&gt;"), ("`", "\\`")):
        text = text.replace(raw, safe)
    return text


def table1_markdown(agg: dict[str, dict[str, dict[str, Any]]]) -> str:
    """Paper Table 1: one row per method, Acc / Lat / Spd per dataset."""
    datasets = list(agg)
    names = sorted({m for ds in agg.values() for m in ds}, key=method_sort_key)
    head = ["Method", "τ / p"] + [f"{md_cell(ds)} {c}" for ds in datasets for c in ("Acc ↑", "Lat (s) ↓", "Spd ↑")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        any_stats = next(agg[ds][name] for ds in datasets if name in agg[ds])
        label = md_cell(any_stats["label"].split(" ")[0])
        cells = [label, _param(any_stats)]
        for ds in datasets:
            s = agg[ds].get(name)
            if s is None:
                cells += ["", "", ""]
                continue
            cells += [_f(s["acc"]), _f(s["latency_s"]), _f(s["speedup"], "{:.2f}×")]
        lines.append("| " + " | ".join(cells) + " |")
    ns = ", ".join(f"{ds}: n={next(iter(agg[ds].values()))['n']}" for ds in datasets)
    lines.append("")
    lines.append(f"Acc in %, Lat = mean wall-clock seconds per sample (batching: see the run settings), Spd = Lat(LLM) / Lat(method). {ns}.")
    return "\n".join(lines)


def token_table_markdown(stats: dict[str, dict[str, Any]], dataset: str) -> str:
    """Paper's per-dataset token table."""
    head = ["Method", "τ / p", "Acc", "Lat (s)", "Spd", "LLM Tok.", "SLM Tok.", "Total Tok.", "Reduction (%)", "Switches"]
    lines = [f"### {md_cell(dataset)}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in stats.items():
        red = s["token_reduction_pct"]
        red_s = "--" if name == "llm" or red is None else f"{red:+.2f}%"
        lines.append("| " + " | ".join([
            md_cell(s["label"].split(" ")[0]), _param(s), _f(s["acc"]), _f(s["latency_s"]), _f(s["speedup"], "{:.2f}×"),
            _f(s["llm_tokens"]), _f(s["slm_tokens"]), _f(s["total_tokens"]), red_s, _f(s["switches"]),
        ]) + " |")
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    """Device and library versions of the machine running this (recorded at run time)."""
    import torch
    import transformers

    import hf_rstitch

    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__, "hf_rstitch": hf_rstitch.__version__}
    try:
        import math_verify  # noqa: F401
        from importlib.metadata import version

        versions["math_verify"] = version("math-verify")
    except Exception:
        pass
    if torch.cuda.is_available():
        device = f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"
    else:
        device = f"CPU {platform.processor() or platform.machine()}"
    return {"device": device, "versions": versions, "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def _no_nan(x: Any) -> Any:
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: _no_nan(v) for k, v in x.items()}
    return x


def build_summary(agg: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """The JSON summary: device, versions, run date and settings (budget...), then results."""
    return {**meta, "report_date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "results": _no_nan(agg)}


def _batching(batch_size: int) -> str:
    if batch_size <= 1:
        return "batch size 1 (latency per problem alone)"
    return (f"continuous batching of {batch_size} problems (latency: each problem's own time in the batch; "
            "speculative decoding at batch size 1)")


def write_report(out_dir: str | Path, records: list[dict[str, Any]], meta: dict[str, Any],
                 plots: bool = True) -> dict[str, Any]:
    """Write ``report.md``, ``summary.json`` and (optionally) the plots; return the summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not records:
        raise ValueError(f"no records to report in {out}; run the evaluation first (drop --report-only).")
    agg = aggregate(records)
    summary = build_summary(agg, meta)
    settings = meta.get("settings", {})
    md = [
        "# R-Stitch evaluation", "",
        f"LLM `{reference(settings.get('llm'))}`, SLM `{reference(settings.get('slm'))}`; device: {meta.get('device')}; "
        f"budget {settings.get('max_new_tokens')} new tokens, "
        f"{'sampled' if settings.get('do_sample') else 'greedy'}; {_batching(meta.get('batch_size', 1))}; "
        f"run {meta.get('date')}.", "",
        "## Accuracy / latency / speedup (paper Table 1 layout)", "", table1_markdown(agg), "",
        "## Tokens per dataset", "",
    ]
    for ds, stats in agg.items():
        md += [token_table_markdown(stats, ds), ""]
    if plots:
        from .plots import plot_per_sample, plot_tradeoff

        files = [plot_tradeoff(agg, out / "tradeoff.png")]
        for ds in agg:
            for name in agg[ds]:
                if name not in ("llm", "slm") and not name.startswith("random"):
                    file = safe_file_name(f"{ds}__{name}.png")
                    files.append(plot_per_sample(records, ds, name, out / "per_sample" / file))
        summary["plots"] = [str(Path(f).relative_to(out)) for f in files if f]
        md += ["## Plots", ""] + [f"![{Path(f).stem}]({Path(f).relative_to(out)})" for f in files if f] + [""]
    (out / "report.md").write_text("\n".join(md), encoding="utf-8")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n", encoding="utf-8")
    return summary
