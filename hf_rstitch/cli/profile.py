"""``rstitch profile``: time a model's forward calls and write its latency profile (Eq. 4).

    rstitch profile --model Qwen/Qwen2.5-1.5B --device cuda --dtype bfloat16 --out slm.json
    rstitch profile --random-qwen2 7b --max-kv 4096          # real shape, random weights

The JSON it writes is read by :class:`hf_rstitch.latency.LatencyModel`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .args import add_dataclass_args, dataclass_from_args

NAME = "profile"
HELP = "time forward calls over an (N_inf, N_kv) grid and fit the latency model (paper Eq. 4)"
DTYPES = ("bfloat16", "float16", "float32")


@dataclass
class ProfileConfig:
    model: str | None = field(default=None, metadata={"help": "model path, Hub id or shipped:llm / shipped:slm to profile"})
    random_qwen2: str | None = field(default=None, metadata={
        "help": "profile a random-weight Qwen2 of this shape instead of --model (timing only)",
        "choices": ["1.5b", "7b"]})
    device: str = field(default="auto", metadata={"help": "cuda, cuda:1, cpu, mps, ... (auto: cuda if available)"})
    dtype: str = field(default="bfloat16", metadata={"help": "weight dtype", "choices": list(DTYPES)})
    out: str | None = field(default=None, metadata={"help": "JSON profile to write (default latency_<model>.json)"})
    n_inf: list[int] = field(default_factory=lambda: [1, 4, 16, 64, 256, 1024, 2048],
                             metadata={"help": "tokens processed per timed call (grid axis N_inf)"})
    n_kv: list[int] = field(default_factory=lambda: [0, 512, 1024, 2048, 4096, 8192],
                            metadata={"help": "cache sizes before the call (grid axis N_kv)"})
    max_kv: int | None = field(default=None, metadata={
        "help": "KV budget: drop --n-kv values above it and add it as the top point"})
    repeats: int = field(default=3, metadata={"help": "timed calls per grid cell; the median is kept"})
    warmup: int = field(default=2, metadata={"help": "untimed calls per grid cell before timing"})
    logits_to_keep: int = field(default=1, metadata={
        "help": "positions the LM head runs on (1 = last token, as in generation; 0 = all)"})
    attn_implementation: str | None = field(default=None, metadata={"help": "sdpa, eager, flash_attention_2, ..."})
    trust_remote_code: bool = field(default=False, metadata={"help": "allow custom model code from the Hub"})
    seed: int = field(default=0, metadata={"help": "seed for random ids (and random weights)"})
    relative_fit: bool = field(default=False, metadata={
        "help": "fit Eq. 4 to relative rather than absolute errors: decode steps of a few ms then count as much as "
                "prefills of hundreds (use when the grid is much wider than the calls you will predict)"})

    def __post_init__(self) -> None:
        from ..latency.model import grid_is_fittable
        from ..resources import resolve

        self.model = resolve(self.model)  # shipped:llm -> its folder
        if (self.model is None) == (self.random_qwen2 is None):
            raise ValueError("give exactly one of --model PATH_OR_HUB_ID or --random-qwen2 {1.5b,7b}.")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {DTYPES}, got {self.dtype!r}.")
        if self.max_kv is not None:
            if self.max_kv < 0:
                raise ValueError(f"--max-kv must be >= 0, got {self.max_kv}.")
            self.n_kv = sorted({k for k in self.n_kv if k <= self.max_kv} | {self.max_kv})
        if not self.n_inf or not self.n_kv:
            raise ValueError("empty grid: --n-inf and --n-kv each need at least one value.")
        if min(self.n_inf) < 1 or min(self.n_kv) < 0:
            raise ValueError(f"--n-inf values must be >= 1 and --n-kv values >= 0; got {self.n_inf} and {self.n_kv}.")
        if not grid_is_fittable(self.n_inf, self.n_kv):
            raise ValueError(f"grid --n-inf {self.n_inf} x --n-kv {self.n_kv} cannot determine a, b, c, d: use at "
                             "least 3 distinct --n-inf values (one > 1) and 2 distinct --n-kv values.")
        if self.repeats < 1 or self.warmup < 0 or self.logits_to_keep < 0:
            raise ValueError("--repeats must be >= 1, --warmup >= 0 and --logits-to-keep >= 0.")

    @property
    def label(self) -> str:
        return f"random-qwen2-{self.random_qwen2}" if self.random_qwen2 else self.model  # type: ignore[return-value]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_args(parser, ProfileConfig)


def _load(cfg: ProfileConfig):
    import torch

    device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, cfg.dtype)
    if cfg.random_qwen2:
        from ..latency.profiler import random_qwen2

        return random_qwen2(cfg.random_qwen2, dtype=dtype, device=device, seed=cfg.seed)
    from transformers import AutoModelForCausalLM

    from ..sources import check_hub_source

    check_hub_source(cfg.model, "--model")
    kwargs = {"dtype": dtype, "trust_remote_code": cfg.trust_remote_code}
    if cfg.attn_implementation:
        kwargs["attn_implementation"] = cfg.attn_implementation
    return AutoModelForCausalLM.from_pretrained(cfg.model, **kwargs).to(device).eval()


def run(args: argparse.Namespace) -> int:
    try:
        cfg = dataclass_from_args(ProfileConfig, args)
    except ValueError as err:
        print(f"rstitch profile: {err}", file=sys.stderr)
        return 2
    from ..latency.profiler import fit_summary, profile_model

    model = _load(cfg)
    if cfg.random_qwen2 and cfg.attn_implementation:
        model.config._attn_implementation = cfg.attn_implementation
    print(f"profiling {cfg.label} on {next(model.parameters()).device} ({cfg.dtype}): "
          f"{len(cfg.n_inf)} N_inf x {len(cfg.n_kv)} N_kv cells, {cfg.repeats} repeats", file=sys.stderr)
    profile = profile_model(model, n_inf=cfg.n_inf, n_kv=cfg.n_kv, repeats=cfg.repeats, warmup=cfg.warmup,
                            logits_to_keep=cfg.logits_to_keep, name=cfg.label, seed=cfg.seed,
                            relative_fit=cfg.relative_fit)
    out = Path(cfg.out or f"latency_{Path(cfg.label).name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(profile.to_dict(), indent=1) + "\n")
    print(fit_summary(profile))
    print(f"wrote {out}")
    return 0
