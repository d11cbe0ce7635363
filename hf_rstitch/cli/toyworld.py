"""``rstitch toyworld``: the offline toy world (data, tokenizer, training, evaluation).

Subcommands::

    rstitch toyworld data --split test --n 600 --out test.jsonl
    rstitch toyworld tokenizer --out runs/toyworld/tokenizer
    rstitch toyworld train --preset llm --out runs/toyworld/llm
    rstitch toyworld eval --model hf_rstitch/assets/pair/slm --n 100   # default: the shipped LLM
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field

from hf_rstitch.cli.args import add_dataclass_args, dataclass_from_args

NAME = "toyworld"
HELP = "toy world: generate arithmetic word problems, build the tokenizer, train and evaluate the pair"
DESCRIPTION = HELP + ". The shipped pair under hf_rstitch/assets/pair was made with these commands."

_STYLES = ["concise", "verbose"]


@dataclass
class DataConfig:
    """Generating a JSONL split of toy-world problems."""

    out: str = field(default="toyworld.jsonl", metadata={"help": "JSONL file to write"})
    split: str = field(default="test", metadata={"help": "which split",
                                                  "choices": ["train", "valid", "test"]})
    n: int = field(default=600, metadata={"help": "number of rows"})
    seed: int = field(default=0, metadata={"help": "generator seed"})
    style: str = field(default="verbose", metadata={"help": "reasoning style of the reference "
                                                             "reasoning", "choices": _STYLES})

    def __post_init__(self) -> None:
        if self.n <= 0:
            raise ValueError(f"--n must be positive, got {self.n}")


@dataclass
class TokenizerConfig:
    """Building and saving the shared tokenizer."""

    out: str = field(default="runs/toyworld/tokenizer", metadata={"help": "folder to save into"})


@dataclass
class EvalConfig:
    """Greedy single-model evaluation on the test split."""

    model: str = field(default="", metadata={"help": "model folder; empty: the shipped pair's LLM"})
    data: str = field(default="", metadata={"help": "JSONL of problems; default: the shipped test split"})
    n: int = field(default=0, metadata={"help": "first N problems only; 0 = all"})
    batch_size: int = field(default=32, metadata={"help": "problems per generate call"})
    device: str = field(default="cpu", metadata={"help": "cpu or cuda"})
    max_new_tokens: int = field(default=400, metadata={"help": "generation cap"})
    json_out: str = field(default="", metadata={"help": "also write the metrics JSON here"})
    opener: str = field(default="", metadata={
        "help": "write this at the start of every answer, e.g. 'So' to make a model answer in the concise "
                "style (how well the LLM does inside the SLM's traces)"})

    def __post_init__(self) -> None:
        if self.n < 0:
            raise ValueError(f"--n must be >= 0 (0 = all problems), got {self.n}")
        if self.batch_size < 1 or self.max_new_tokens < 1:
            raise ValueError(f"--batch-size and --max-new-tokens must be positive, got {self.batch_size} and "
                             f"{self.max_new_tokens}")
        from hf_rstitch.sources import check_device, check_local_source

        if not self.model:
            from hf_rstitch.toyworld.pair import ASSETS

            self.model = str(ASSETS / "llm")
        check_local_source(self.model, "--model")
        if self.data and not os.path.isfile(self.data):
            raise FileNotFoundError(f"--data {self.data}: no such file; give a JSONL of problems "
                                    "(rstitch toyworld data writes one) or leave it out for the shipped test split.")
        check_device(self.device)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hf_rstitch.toyworld.train import TrainConfig

    sub = parser.add_subparsers(dest="toyworld_command", metavar="STEP")
    for name, cls, text in [("data", DataConfig, "write a JSONL split"),
                            ("tokenizer", TokenizerConfig, "build and save the tokenizer"),
                            ("train", TrainConfig, "train one model of the pair"),
                            ("eval", EvalConfig, "greedy accuracy of one model")]:
        p = sub.add_parser(name, help=text, description=cls.__doc__,
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        add_dataclass_args(p, cls)
        p.set_defaults(_toy_config=cls)


def run(args: argparse.Namespace) -> int:
    if not getattr(args, "toyworld_command", None):
        print("rstitch toyworld: choose a step (data, tokenizer, train, eval); see --help",
              file=sys.stderr)
        return 2
    cfg = dataclass_from_args(args._toy_config, args)
    return {"data": _data, "tokenizer": _tokenizer, "train": _train, "eval": _eval}[
        args.toyworld_command](cfg)


def _data(cfg: DataConfig) -> int:
    from hf_rstitch.toyworld.tasks import make_split, write_jsonl

    path = write_jsonl(make_split(cfg.split, cfg.n, cfg.seed, style=cfg.style), cfg.out)
    print(f"wrote {cfg.n} {cfg.split} rows to {path}")
    return 0


def _tokenizer(cfg: TokenizerConfig) -> int:
    from hf_rstitch.toyworld.tokenizer import build_default_tokenizer

    tok = build_default_tokenizer()
    tok.save_pretrained(cfg.out)
    print(f"saved tokenizer ({len(tok)} tokens) to {cfg.out}")
    return 0


def _train(cfg) -> int:
    from hf_rstitch.toyworld.train import train

    train(cfg, log=lambda line: print(line, flush=True))
    return 0


def _eval(cfg: EvalConfig) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_rstitch.toyworld.evaluate import evaluate
    from hf_rstitch.toyworld.pair import load_test_split
    from hf_rstitch.toyworld.tasks import read_jsonl

    rows = read_jsonl(cfg.data) if cfg.data else load_test_split()
    rows = rows[:cfg.n] if cfg.n else rows
    tok = AutoTokenizer.from_pretrained(cfg.model)
    model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32).to(cfg.device).eval()
    ev = evaluate(model, tok, rows, cfg.batch_size, cfg.max_new_tokens,
                  progress=lambda done, total: print(f"\r{done}/{total}", end="", file=sys.stderr),
                  opener=cfg.opener)
    print(file=sys.stderr)
    metrics = {k: v for k, v in ev.items() if k != "results"}
    print(json.dumps({"model": cfg.model, "opener": cfg.opener, **metrics}))
    if cfg.json_out:
        with open(cfg.json_out, "w") as f:
            json.dump({"model": cfg.model, "opener": cfg.opener, **ev}, f, indent=1)
    return 0
