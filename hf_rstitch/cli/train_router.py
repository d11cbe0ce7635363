"""``rstitch train-router``: train an R-Stitch+ router with DAPO and a latency-aware reward.

Thin wrapper over :func:`hf_rstitch.training.router.train_router`; options come from
``RouterTrainConfig`` (help text and validation live there).
"""

from __future__ import annotations

import argparse

from hf_rstitch.cli.args import add_dataclass_args, dataclass_from_args
from hf_rstitch.router.config import RouterTrainConfig

NAME = "train-router"
HELP = "train the R-Stitch+ router (DAPO, reward = accuracy - lambda * accuracy * predicted latency)"
DESCRIPTION = (
    "Sample G routed trajectories per prompt with batched stitched decoding, reward them with "
    "r_acc - lambda * r_acc * L_hat (L_hat: the latency model's estimate in ms), and update the router with "
    "DAPO (group-normalised advantages, clip-higher, token-level normalisation, dynamic sampling). Writes "
    "metrics.jsonl, a resumable checkpoint/ and the final router/ (load it with Router.from_pretrained or "
    "generate(..., stitch_router=PATH)) under --out. Without --llm/--slm/--data it trains on the shipped toy pair."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_args(parser, RouterTrainConfig)


def run(args: argparse.Namespace) -> int:
    from hf_rstitch.cli.preflight import preflight

    cfg = dataclass_from_args(RouterTrainConfig, args)
    preflight(cfg.data, sources={"--llm": cfg.llm, "--slm": cfg.slm})  # before torch and the models load
    from hf_rstitch.training.router import train_router

    train_router(cfg, log=lambda line: print(line, flush=True))  # bad input: cli.main says what
    print(f"router saved to {cfg.out}/router (metrics: {cfg.out}/metrics.jsonl)")
    return 0
