"""``RouterTrainConfig``: every knob of router training, with help text and validation.

The CLI (``rstitch train-router``) is generated from this dataclass and the Python API
(:func:`hf_rstitch.training.router.train_router`) takes it. Importing it is cheap (no torch).
Defaults follow the paper (lambda = 5e-6, tau = 0.001, 32 prompts per batch, G = 8); the
shipped router used other values for lambda (see docs/router.md).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


def _help(text: str, **extra: Any) -> dict[str, Any]:
    return {"help": text, **extra}


@dataclass
class RouterTrainConfig:
    llm: str = field(default="", metadata=_help("LLM checkpoint (local path or Hub id); empty: the shipped toy pair."))
    slm: str = field(default="", metadata=_help("SLM checkpoint (same tokenizer); empty: the shipped toy pair."))
    data: str = field(default="", metadata=_help(
        "Training prompts: JSONL with problem/answer per line; empty: a generated toy-world train split."))
    n_train: int = field(default=4096, metadata=_help("Rows of the generated toy-world train split (when --data is empty)."))
    instruction: str = field(default="", metadata=_help("Instruction appended to each problem (empty for the toy pair)."))
    latency_profile: str = field(default="auto", metadata=_help(
        "LatencyModel JSON with 'slm' and 'llm' profiles (rstitch profile, LatencyModel.save); 'auto' profiles "
        "both models on --device before training and saves the result in --out."))
    out: str = field(default="runs/router", metadata=_help(
        "Output folder: metrics.jsonl, checkpoint/ (resumable), router/ (final, save_pretrained), config.json."))
    threshold: float = field(default=0.001, metadata=_help(
        "tau: the router is consulted only on SLM steps whose normalized entropy exceeds it."))
    lam: float = field(default=5e-6, metadata=_help(
        "lambda of r_eff = -lambda * r_acc * L_hat (L_hat in ms). Pick it so lambda * L_hat of a typical correct "
        "trajectory is a few tenths (the paper: 5e-6 x tens of seconds)."))
    steps: int = field(default=100, metadata=_help("DAPO steps (one batch of groups each)."))
    batch_prompts: int = field(default=32, metadata=_help("Prompts per step."))
    group_size: int = field(default=8, metadata=_help("G: rollouts per prompt."))
    lr: float = field(default=1e-3, metadata=_help("AdamW learning rate of the router."))
    weight_decay: float = field(default=0.0, metadata=_help("AdamW weight decay."))
    epochs: int = field(default=2, metadata=_help("Gradient steps on each batch of rollouts (pi_old = rollout policy)."))
    scale_advantages: bool = field(default=True, metadata=_help(
        "Divide advantages by the group's reward std (Eq. 8). --no-scale-advantages keeps R - mean, so lambda "
        "sets the latency/accuracy exchange rate also inside all-correct groups (see docs/router.md)."))
    eps_low: float = field(default=0.2, metadata=_help("Lower clip range: ratio >= 1 - eps_low."))
    eps_high: float = field(default=0.28, metadata=_help("Upper clip range (DAPO clip-higher): ratio <= 1 + eps_high."))
    max_grad_norm: float = field(default=1.0, metadata=_help("Gradient clipping norm (0: off)."))
    max_new_tokens: int = field(default=400, metadata=_help("Decoding budget of each rollout."))
    do_sample: bool = field(default=True, metadata=_help("Sample rollout tokens (the router always samples)."))
    temperature: float = field(default=1.0, metadata=_help("Token sampling temperature of rollouts."))
    top_p: float = field(default=1.0, metadata=_help("Token nucleus sampling p of rollouts."))
    width: int = field(default=32, metadata=_help("Router MLP width."))
    num_blocks: int = field(default=6, metadata=_help("Residual FFN blocks (the paper: 6)."))
    llm_bias: float = field(default=0.0, metadata=_help("Initial bias of the router's 'llm' logit (0: a fair coin)."))
    seed: int = field(default=0, metadata=_help("Seed for data order, router init and sampling."))
    device: str = field(default="auto", metadata=_help("auto (cuda if available), cuda, cpu."))
    checkpoint_every: int = field(default=10, metadata=_help("Save a resumable checkpoint every N steps (and at the end)."))
    resume: bool = field(default=True, metadata=_help("Resume from --out/checkpoint if present."))
    max_minutes: float = field(default=0.0, metadata=_help("Stop (and checkpoint) after this many minutes; 0: no limit."))
    progress: bool = field(default=True, metadata=_help("Print one line per step."))

    def __post_init__(self) -> None:
        checks = [
            (0.0 <= self.threshold <= 1.0 and math.isfinite(self.threshold), "--threshold must be in [0, 1]"),
            (self.lam >= 0 and math.isfinite(self.lam), "--lam must be a finite number >= 0"),
            (self.steps > 0, "--steps must be positive"),
            (self.batch_prompts > 0, "--batch-prompts must be positive"),
            (self.group_size >= 2, "--group-size must be >= 2 (advantages are normalised within a group)"),
            (self.lr > 0, "--lr must be positive"),
            (self.epochs > 0, "--epochs must be positive"),
            (0 < self.eps_low < 1 and self.eps_high > 0, "clip ranges need 0 < --eps-low < 1 and --eps-high > 0"),
            (self.max_new_tokens > 0, "--max-new-tokens must be positive"),
            (not self.do_sample or (self.temperature > 0 and 0 < self.top_p <= 1),
             "sampling needs --temperature > 0 and --top-p in (0, 1]"),
            (self.width > 0 and self.num_blocks >= 0, "--width must be positive and --num-blocks >= 0"),
            (self.checkpoint_every > 0, "--checkpoint-every must be positive"),
            (self.n_train > 0, "--n-train must be positive"),
            (self.max_minutes >= 0, "--max-minutes must be >= 0"),
        ]
        bad = [msg for ok, msg in checks if not ok]
        if bad:
            raise ValueError("; ".join(bad) + f" (got {self.describe()}).")
        if bool(self.llm) != bool(self.slm):
            raise ValueError("give both --llm and --slm, or neither (the shipped toy pair).")
        from ..sources import check_device, check_local_source

        for flag, source in (("--llm", self.llm), ("--slm", self.slm)):
            if source:
                check_local_source(source, flag)
        check_device(self.device)

    def describe(self) -> str:
        keys = ("threshold", "lam", "steps", "batch_prompts", "group_size", "lr", "epochs", "eps_low", "eps_high",
                "temperature", "top_p", "width", "num_blocks", "n_train", "max_minutes")
        return ", ".join(f"{k}={getattr(self, k)!r}" for k in keys)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
