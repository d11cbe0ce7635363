"""Which modules of each zoo architecture a fused kernel may stand in for: the module lines of ``FastLane.plan``.

For every tiny LLM of the zoo suite (``tests/zoo_models.py``: every causal LM transformers ships), the plan of
``FastConfig(graphs=False, compile="parts")`` on this device, counted per part: norms, decoder layers, attention
that folds at one row, routers whose probe agrees (:mod:`hf_rstitch.fast.probes`), and the modules that keep
their own code because their probe differs or fails. Writes ``benchmarks/results/zoo_plans_<device>.json`` and a
markdown table; no timing. ``--before FILE``: a JSON of earlier counts (same keys) to print side by side (the
shipped result's: the source-text checks of commit 76587c9, before the probes, counted the same way).

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/zoo_plans.py
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(Path(__file__).resolve().parent)]
PARTS = ("norm", "layer", "attn_plain", "router")


def counts(model, config) -> dict:
    """Per part, the modules whose probe agrees, and the module lines that keep the model's code."""
    from hf_rstitch.fast import plan_for

    found = dict.fromkeys(PARTS, 0)
    own = []
    for line in plan_for(model, config, head_dim=16).modules:  # any head size: the cache is not built
        if "probe equal" in line.why:
            found[line.part] += line.count
            found["attn_plain"] += line.count if "folded into" in (line.kernel or "") else 0
        else:
            own.append(str(line))
    return {**found, "own code": own}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--before", default=None, help="JSON of earlier counts per architecture")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    import torch

    from hf_rstitch.fast import FastConfig
    from hf_rstitch.fast.patches import folds
    from lab import RESULTS, environment, write_result
    from zoo_models import EXCLUDED, build_pair, zoo

    config = FastConfig(graphs=False, compile="parts")
    rows = {}
    for model_type in (t for t in zoo() if t not in EXCLUDED):
        try:
            llm, _ = build_pair(model_type)
        except Exception as err:  # noqa: BLE001 - the zoo suite reports these; here they only have no row
            rows[model_type] = {"error": f"{type(err).__name__}: {err}"[:200]}
            continue
        llm = llm.to(args.device)
        rows[model_type] = counts(llm, config)
        # folds need the tuned products (CUDA): count the attentions whose probe agrees in pre-norm layers instead
        rows[model_type]["attn_plain"] = sum(folds.plain_attention(m.self_attn).same for m in llm.modules()
                                             if type(m).__name__.endswith("DecoderLayer") and hasattr(m, "self_attn")
                                             and "probe equal" in _layer_why(m))
    before = json.loads(Path(args.before).read_text()) if args.before else {}
    name = "cpu" if args.device == "cpu" else torch.cuda.get_device_name(0).lower().replace(" ", "_")
    write_result(RESULTS / f"zoo_plans_{name}", {"environment": environment([args.device]), "rows": rows,
                                                 "before": before}, _table(rows, before))
    print(_table(rows, before))


def _layer_why(layer) -> str:
    from hf_rstitch.fast.patches import add_norm

    return add_norm.verdict(layer).why


def _table(rows: dict, before: dict) -> str:
    head = "| architecture | " + " | ".join(f"{p} (before)" if before else p for p in PARTS) + " |"
    lines = [head, "|" + "---|" * (len(PARTS) + 1)]
    for name, row in rows.items():
        if "error" in row or not any(row[p] or before.get(name, {}).get(p) for p in PARTS):
            continue
        cells = [f"{row[p]} ({before[name][p]})" if isinstance(before.get(name), dict) else str(row[p])
                 for p in PARTS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    totals = [sum(r[p] for r in rows.values() if "error" not in r) for p in PARTS]
    was = [sum(b[p] for b in before.values() if isinstance(b, dict)) for p in PARTS] if before else None
    cells = [f"{t} ({w})" for t, w in zip(totals, was)] if was else map(str, totals)
    lines.append("| **all** | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
