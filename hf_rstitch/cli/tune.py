"""``rstitch tune``: choose tau for an accuracy budget or a speed target on a dev split.

    rstitch tune --llm shipped:llm --slm shipped:slm --max-drop 1 --n 100
    rstitch tune --llm L --slm S --data dev.jsonl --max-drop 1 --latency latency.json --write-config L

Decodes the dev split as left-padded batches with the LLM alone (the accuracy reference, tau = 0)
and at every ``--thresholds`` value, grades the answers, predicts each point's latency
with the latency model when ``--latency`` is given, and lets :func:`hf_rstitch.eval.choose.choose`
pick. Prints a table and, as its last line, a JSON document whose ``threshold`` is the choice (null
when no threshold meets the budgets; exit status 1 then). ``--write-config DIR`` stores the choice
(and the SLM, and ``--router``) on the LLM's generation config and writes ``DIR/generation_config.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field

from .args import add_dataclass_args, dataclass_from_args

NAME = "tune"
HELP = "choose the threshold tau for an accuracy budget (--max-drop) or a speed target (--target-speedup)"
DESCRIPTION = re.sub(r":\w+:`~?([\w.]+\.)?(\w+)`", r"\2()", __doc__.split("\n\n", 2)[2]).replace("``", "`")
DEV_SEED = 0  # the shipped pair's valid split: rstitch toyworld data --split valid --seed 0
DEFAULT_THRESHOLDS = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1]


@dataclass
class TuneConfig:
    llm: str = field(default="", metadata={"help": "LLM: local folder, Hub id, or shipped:llm"})
    slm: str = field(default="", metadata={"help": "SLM (same tokenizer): local folder, Hub id, or shipped:slm"})
    data: str = field(default="", metadata={"help": "dev split: JSONL / csv / json / parquet file or Hub dataset "
                                                    "(see rstitch eval --help); default for the shipped pair: its "
                                                    "valid split (toyworld, seed 0, no overlap with test)"})
    columns: str = field(default="", metadata={"help": "column mapping for --data, e.g. problem=question,answer=final_answer"})
    max_drop: float | None = field(default=None, metadata={"help": "accuracy budget: points below the LLM alone"})
    target_speedup: float | None = field(default=None, metadata={
        "help": "speed target: predicted speed-up over the LLM alone (needs --latency)"})
    n: int = field(default=100, metadata={"help": "dev problems to decode (the first N)"})
    thresholds: list[float] = field(default_factory=lambda: list(DEFAULT_THRESHOLDS), metadata={
        "help": "candidate thresholds (the LLM alone, tau = 0, is always measured)"})
    latency: str = field(default="", metadata={
        "help": "latency model JSON (rstitch profile; shipped:latency for the shipped pair's H200 profile)"})
    router: str = field(default="", metadata={"help": "also report this R-Stitch+ router's point (folder, Hub id or shipped)"})
    max_new_tokens: int = field(default=1024, metadata={"help": "decoding budget per problem"})
    batch_size: int = field(default=16, metadata={"help": "problems decoded together (left-padded)"})
    instruction: str | None = field(default=None, metadata={
        "help": "instruction after each problem (default: the boxed-answer one; none for the shipped pair)"})
    device: str = field(default="auto", metadata={"help": "auto (cuda if available), cuda, cpu"})
    dtype: str = field(default="auto", metadata={"help": "auto (bfloat16 on CUDA, float32 on CPU), float32, float16, bfloat16"})
    write_config: str = field(default="", metadata={
        "help": "store the choice on the LLM's generation config and write DIR/generation_config.json"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})

    def __post_init__(self):
        from ..eval.choose import check_budgets
        from ..eval.data import parse_columns
        from ..hf.settings import threshold_value

        if not self.llm or not self.slm:
            raise ValueError("--llm and --slm are required (folders, Hub ids, or shipped:llm / shipped:slm).")
        check_budgets(self.max_drop, self.target_speedup)
        if self.target_speedup is not None and not self.latency:
            raise ValueError("--target-speedup needs --latency PROFILE.json (rstitch profile --llm ... --slm ...).")
        if self.n <= 0 or self.batch_size <= 0 or self.max_new_tokens <= 0:
            raise ValueError("--n, --batch-size and --max-new-tokens must be positive.")
        self.thresholds = sorted({threshold_value(t) for t in self.thresholds} - {0.0})
        parse_columns(self.columns)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_args(parser, TuneConfig)


def toy_dev_split(n: int) -> tuple[list[dict], str]:
    """The shipped pair's dev split: ``n`` problems of the toy world's valid split (seed :data:`DEV_SEED`)."""
    from ..toyworld.tasks import make_split

    return make_split("valid", n, DEV_SEED), f"toyworld valid split (seed {DEV_SEED})"


def run(args: argparse.Namespace) -> int:
    try:
        cfg = dataclass_from_args(TuneConfig, args)
        from .preflight import preflight

        preflight(cfg.data, cfg.columns, cfg.n, {"--llm": cfg.llm, "--slm": cfg.slm, "--router": cfg.router})
        from ..eval.tuning import tune

        result = tune(cfg, toy_split=toy_dev_split)
    except (ImportError, OSError) as err:  # a missing extra or an unreadable file; ValueError: cli.main
        print(f"rstitch tune: error: {err}", file=sys.stderr)
        return 2
    print(result.pop("table"))
    print(f"\n{result['reason']}" + (f"; wrote {result['wrote']}" if result.get("wrote") else ""))
    print(json.dumps(result, default=str))
    return 0 if result["threshold"] is not None else 1
