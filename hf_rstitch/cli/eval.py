"""``rstitch eval``: accuracy, latency and tokens of LLM-only, SLM-only, speculative decoding,
R-Stitch at several thresholds and random routing on math benchmarks, in the paper's layout.

Thin wrapper over :func:`hf_rstitch.eval.evaluate`; options come from ``EvalConfig``.
"""

from __future__ import annotations

import argparse
import json

from hf_rstitch.cli.args import add_dataclass_args, dataclass_from_args
from hf_rstitch.eval.config import EvalConfig

NAME = "eval"
HELP = "evaluate R-Stitch against LLM-only, SLM-only, speculative decoding and random routing"
DESCRIPTION = (
    "Run every method on every problem of the given JSONL benchmark(s) (id/problem/answer per line), "
    "grade the \\boxed{} answers, and write records.jsonl (resumable), report.md (paper Table 1 layout "
    "and token tables), summary.json and plots under --out. --report-only re-tabulates existing records."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_args(parser, EvalConfig)


def run(args: argparse.Namespace) -> int:
    from hf_rstitch.cli.preflight import preflight

    cfg = dataclass_from_args(EvalConfig, args)
    if not cfg.report_only:  # bad data or a model that cannot load: one line, before torch loads
        router = cfg.router_path if "router" in cfg.methods else ""
        preflight(cfg.data, cfg.columns, cfg.limit, {"--llm": cfg.llm, "--slm": cfg.slm, "--router-path": router})
    from hf_rstitch.eval.api import evaluate

    summary = evaluate(cfg)  # bad options or data: cli.main says what, not a traceback
    from hf_rstitch.eval.launched import launched

    where = launched()
    if where is not None and where[0] != 0 and cfg.shard == "0/1":
        return 0  # torchrun / accelerate launch: rank 0 prints the merged report
    print(summary.pop("table1_markdown"))
    print(f"\nreport: {cfg.out}/report.md")
    print(json.dumps({"device": summary.get("device"), "out": cfg.out,
                      "results": summary["results"]}, default=str))
    return 0
