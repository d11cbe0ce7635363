"""R-Stitch+ vs R-Stitch thresholds through the evaluation harness (hf_rstitch.eval), batch size 1.

    python benchmarks/router_eval_pair.py --router hf_rstitch/assets/router --out OUT --limit 40

Greedy decoding on the shipped pair's held-out test split; wall-clock latency per problem
(the harness's timing) and, from the saved traces, the latency model's estimate L_hat.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    from hf_rstitch.eval import EvalConfig, evaluate
    from hf_rstitch.latency import LatencyModel
    from hf_rstitch.router import RouterPolicy, load_router
    from hf_rstitch.toyworld.pair import ASSETS

    ap = argparse.ArgumentParser()
    ap.add_argument("--router", default=str(REPO / "hf_rstitch/assets/router"))
    ap.add_argument("--latency", default=str(REPO / "hf_rstitch/assets/router/latency.json"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--thresholds", type=float, nargs="+", default=[0.001, 0.002, 0.005, 0.02, 0.05])
    ap.add_argument("--methods", nargs="+", default=["slm", "rstitch", "router"])
    args = ap.parse_args()
    import torch

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    router = load_router(args.router, device=device)
    cfg = EvalConfig(llm=str(ASSETS / "llm"), slm=str(ASSETS / "slm"), data=[str(ASSETS / "test.jsonl")],
                     methods=args.methods, thresholds=args.thresholds, max_new_tokens=400, limit=args.limit,
                     out=args.out, device=args.device, dtype="float32", instruction="", save_traces=True,
                     router=RouterPolicy(router, router.threshold), router_threshold=router.threshold, progress=False)
    summary = evaluate(cfg)
    lm = LatencyModel.load(args.latency)
    rows: dict[str, list] = {}
    for line in (Path(args.out) / "records.jsonl").read_text().splitlines():
        r = json.loads(line)
        rows.setdefault(r["method"], []).append(r)
    table = {}
    for name, recs in rows.items():
        table[name] = {"n": len(recs), "accuracy": statistics.fmean(r["correct"] for r in recs),
                       "wall_ms": 1e3 * statistics.fmean(r["latency_s"] for r in recs),
                       "lhat_ms": statistics.fmean(lm.predict_trace(r["trace"]) for r in recs) if "trace" in recs[0]
                       else None,
                       "llm_token_share": sum(r["llm_tokens"] for r in recs) / max(1, sum(r["new_tokens"] for r in recs))}
    print(summary.get("table1_markdown", ""))
    print(json.dumps({"device": summary.get("device"), "methods": table}))
    (Path(args.out) / "router_table.json").write_text(json.dumps({"device": summary.get("device"), "methods": table},
                                                                 indent=1) + "\n")


if __name__ == "__main__":
    main()
