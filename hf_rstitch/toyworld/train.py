"""Train one model of the toy-world pair: a HF-native ``LlamaForCausalLM`` / ``Qwen2ForCausalLM``.

Data is generated on the fly (:mod:`hf_rstitch.toyworld.tasks`), formatted with the tokenizer's
chat template, and the loss covers the assistant part only. Each model has an *own* style and
sees the *other* style on a fraction of rows (the issue's lesson: a model stitched into the
other's trace must be able to continue it). On other-style rows the style's opening token is
left out of the loss, so each model still opens its answers in its own style with near-zero
entropy while having learned to continue the other.

Checkpoints are selected on the ``valid`` split (greedy accuracy). The LLM preset also scores each
checkpoint on the valid split *opened in the other style* (``eval_other_style``) and selects on
the sum: in stitched decoding the LLM takes over positions inside the SLM's concise traces, so its
accuracy there matters as much as in its own style. The SLM preset caps the
selected checkpoint's accuracy (``max_valid_accuracy``): the toy SLM is *meant* to be the weaker
model, as L1-Short is in the paper, and the cap keeps it so whatever the hardware's speed.

Not here: stitching, routing, anything that needs two models at once.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from hf_rstitch.toyworld import tasks

from ..hf.loading import resolve_device

# Model shapes and training defaults of each preset. "tiny" is for tests and CPU smoke runs.
PRESETS: dict[str, dict] = {
    "llm": dict(arch="llama", hidden_size=256, num_layers=12, num_heads=4, intermediate_size=704,
                own_style="verbose", other_style_fraction=0.2, lr=1e-3, batch_size=256,
                steps=8000, max_valid_accuracy=0.0, eval_other_style=True),
    "slm": dict(arch="llama", hidden_size=192, num_layers=2, num_heads=3, intermediate_size=512,
                own_style="concise", other_style_fraction=0.15, lr=2e-3, batch_size=256,
                steps=8000, max_valid_accuracy=0.68, eval_other_style=False),
    "tiny": dict(arch="llama", hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                 own_style="concise", other_style_fraction=0.2, lr=3e-3, batch_size=8, steps=4,
                 max_valid_accuracy=0.0, eval_other_style=True),
}
_PRESET_KEYS = sorted(PRESETS["llm"])


@dataclass
class TrainConfig:
    """Training one toy-world model. Fields left at ``None`` take the preset's value."""

    out: str = field(default="runs/toyworld/llm", metadata={"help": "output folder (save_pretrained)"})
    preset: str = field(default="llm", metadata={"help": "model shape and defaults",
                                                   "choices": sorted(PRESETS)})
    arch: str | None = field(default=None, metadata={"help": "llama or qwen2",
                                                      "choices": ["llama", "qwen2"]})
    hidden_size: int | None = field(default=None, metadata={"help": "model width"})
    num_layers: int | None = field(default=None, metadata={"help": "transformer layers"})
    num_heads: int | None = field(default=None, metadata={"help": "attention heads"})
    intermediate_size: int | None = field(default=None, metadata={"help": "MLP width"})
    own_style: str | None = field(default=None, metadata={"help": "the model's preferred style",
                                                           "choices": list(tasks.STYLES)})
    other_style_fraction: float | None = field(default=None, metadata={
        "help": "share of training rows written in the other style"})
    steps: int | None = field(default=None, metadata={"help": "optimizer steps (upper bound)"})
    max_minutes: float = field(default=0.0, metadata={
        "help": "wall-clock budget; the LR schedule runs on max(step/steps, time/budget); 0 = none"})
    batch_size: int | None = field(default=None, metadata={"help": "rows per step"})
    lr: float | None = field(default=None, metadata={"help": "peak AdamW learning rate"})
    warmup_steps: int = field(default=200, metadata={"help": "linear warm-up steps"})
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW weight decay"})
    max_valid_accuracy: float | None = field(default=None, metadata={
        "help": "select the best checkpoint whose valid accuracy is at most this (weak-model "
                "cap); 0 = plain best"})
    eval_other_style: bool | None = field(default=None, metadata={
        "help": "also measure valid accuracy with answers opened in the other style, and select "
                "checkpoints on the sum of both accuracies"})
    init_from: str = field(default="", metadata={
        "help": "continue training the model saved in this folder (its shape replaces the "
                "preset's); empty = random init"})
    eval_every: int = field(default=1000, metadata={"help": "steps between valid evaluations"})
    n_valid: int = field(default=300, metadata={"help": "valid problems per evaluation"})
    log_every: int = field(default=100, metadata={"help": "steps between progress lines"})
    seed: int = field(default=0, metadata={"help": "seed of data stream and init"})
    workers: int = field(default=0, metadata={"help": "data-generating worker processes"})
    max_new_tokens: int = field(default=400, metadata={"help": "generation cap when evaluating"})
    device: str = field(default="auto", metadata={"help": "cuda, cpu or auto"})
    save_dtype: str = field(default="float16", metadata={
        "help": "dtype of the saved weights", "choices": ["float16", "bfloat16", "float32"]})

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {self.preset!r}")
        for key in _PRESET_KEYS:
            if getattr(self, key) is None:
                setattr(self, key, PRESETS[self.preset][key])
        positive = {"--steps": self.steps, "--batch-size": self.batch_size, "--hidden-size": self.hidden_size,
                    "--num-layers": self.num_layers, "--num-heads": self.num_heads, "--eval-every": self.eval_every,
                    "--log-every": self.log_every, "--n-valid": self.n_valid, "--max-new-tokens": self.max_new_tokens}
        bad = [f"{flag} {value}" for flag, value in positive.items() if value < 1]
        bad += [f"{flag} {value}" for flag, value, ok in (
            ("--lr", self.lr, self.lr > 0), ("--warmup-steps", self.warmup_steps, self.warmup_steps >= 0),
            ("--max-minutes", self.max_minutes, self.max_minutes >= 0), ("--workers", self.workers, self.workers >= 0))
            if not ok]
        if bad:
            raise ValueError(f"invalid {', '.join(bad)}: steps, sizes, intervals and budgets must be >= 1, --lr > 0, "
                             "--warmup-steps, --max-minutes and --workers >= 0")
        if not 0.0 <= self.other_style_fraction < 1.0:
            raise ValueError(f"other_style_fraction must be in [0, 1), got {self.other_style_fraction}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} must be divisible by num_heads "
                             f"{self.num_heads}")

    @property
    def style_mix(self) -> dict[str, float]:
        other = "concise" if self.own_style == "verbose" else "verbose"
        return {self.own_style: 1.0 - self.other_style_fraction, other: self.other_style_fraction}


def build_model(cfg: TrainConfig, tokenizer):
    """A randomly initialised HF causal LM of the configured shape, or ``cfg.init_from`` loaded."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if cfg.init_from:
        return _load_init(cfg, tokenizer)

    common = dict(vocab_size=len(tokenizer), hidden_size=cfg.hidden_size,
                  num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                  num_key_value_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size,
                  max_position_embeddings=768, tie_word_embeddings=True,
                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id)
    if cfg.arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**common))
    return Qwen2ForCausalLM(Qwen2Config(**common))


def _load_init(cfg: TrainConfig, tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    folder = Path(cfg.init_from)
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"init_from={cfg.init_from!r} is not a saved model folder (no "
                                "config.json); pass a folder written by save_pretrained")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    if model.config.vocab_size != len(tokenizer):
        raise ValueError(f"init_from model has vocab_size {model.config.vocab_size} but the "
                         f"tokenizer has {len(tokenizer)} tokens; use the tokenizer it was trained with")
    c = model.config
    cfg.arch, cfg.hidden_size, cfg.num_layers = c.model_type, c.hidden_size, c.num_hidden_layers
    cfg.num_heads, cfg.intermediate_size = c.num_attention_heads, c.intermediate_size
    return model


def encode_rows(tokenizer, rows: list[dict], own_style: str) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) of chat-formatted rows; labels are -100 outside the assistant part.

    On rows in the other style the first assistant token (the style's opening word) is masked
    too, so the model learns to continue that style without learning to start it.
    """
    from hf_rstitch.toyworld.tokenizer import prompt_text

    prompts = tokenizer([prompt_text(tokenizer, r["problem"]) for r in rows],
                        add_special_tokens=False)["input_ids"]
    answers = tokenizer([r["reasoning"] for r in rows], add_special_tokens=False)["input_ids"]
    out = []
    for row, prompt, answer in zip(rows, prompts, answers):
        answer = answer + [tokenizer.eos_token_id]
        labels = [-100] * len(prompt) + answer
        if row["style"] != own_style:
            labels[len(prompt)] = -100
        out.append((prompt + answer, labels))
    return out


def collate(pairs: list[tuple[list[int], list[int]]], pad_id: int) -> dict:
    """Right-padded batch: input_ids, attention_mask, labels, each [B, T]."""
    import torch

    width = max(len(ids) for ids, _ in pairs)
    ids = torch.full((len(pairs), width), pad_id)
    labels = torch.full((len(pairs), width), -100)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    for i, (x, y) in enumerate(pairs):
        ids[i, :len(x)], labels[i, :len(y)], mask[i, :len(x)] = torch.tensor(x), torch.tensor(y), 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def style_parts(pairs: list[tuple[list[int], list[int]]], styles: list[str],
                pad_id: int) -> list[dict]:
    """One padded batch per style present: concise rows are ~4x shorter than verbose ones, so
    padding them together would spend most of a mixed batch's compute on padding."""
    return [collate([p for p, s in zip(pairs, styles) if s == style], pad_id)
            for style in tasks.STYLES if style in styles]


def step_loss(model, parts: list[dict], device: str) -> float:
    """Forward + backward over a step's parts; the same token-mean loss as one mixed batch."""
    import torch

    counts = [int((part["labels"][:, 1:] != -100).sum()) for part in parts]
    total, value = max(sum(counts), 1), 0.0
    for part, count in zip(parts, counts):
        batch = {k: v.to(device, non_blocking=True) for k, v in part.items()}
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(**batch).loss * (count / total)
        loss.backward()
        value += loss.item()
    return value


class _Batches:
    """Endless training batches; each data-loader worker draws its own seeded stream."""

    def __init__(self, cfg: "TrainConfig", tokenizer):
        self.cfg, self.tokenizer = cfg, tokenizer

    def __iter__(self) -> Iterator[dict]:
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
        worker = info.id if info else 0
        stream = tasks.iter_rows("train", self.cfg.seed * 1000 + worker, style_mix=self.cfg.style_mix)
        while True:
            rows = [next(stream) for _ in range(self.cfg.batch_size)]
            yield style_parts(encode_rows(self.tokenizer, rows, self.cfg.own_style),
                              [r["style"] for r in rows], self.tokenizer.pad_token_id)


def batches(cfg: "TrainConfig", tokenizer) -> Iterator[dict]:
    """Endless right-padded batches, built by ``cfg.workers`` background processes (0 = inline)."""
    import torch.utils.data

    class _Iterable(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(_Batches(cfg, tokenizer))

    loader = torch.utils.data.DataLoader(_Iterable(), batch_size=None, num_workers=cfg.workers,
                                         prefetch_factor=4 if cfg.workers else None,
                                         pin_memory=False)
    return iter(loader)


def lr_factor(progress: float, step: int, warmup_steps: int) -> float:
    """Linear warm-up then cosine decay to 10 %, over ``progress`` in [0, 1]."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def _score(entry: dict) -> float:
    return entry["accuracy"] + entry.get("other_accuracy", 0.0)


def _select(best: dict | None, acc: float, cap: float, other_acc: float | None = None) -> bool:
    """Whether a checkpoint with valid accuracy ``acc`` (and ``other_acc`` in the other style,
    when measured) replaces ``best``: the cap applies to ``acc``, the score is their sum."""
    if cap and acc > cap:
        return False
    entry = {"accuracy": acc} if other_acc is None else {"accuracy": acc, "other_accuracy": other_acc}
    return best is None or _score(entry) >= _score(best)


def train(cfg: TrainConfig, tokenizer=None, log=print) -> dict:
    """Train, select on valid, save to ``cfg.out``; returns the run summary (also saved as JSON)."""
    import torch

    from hf_rstitch.toyworld.tokenizer import build_default_tokenizer

    torch.manual_seed(cfg.seed)
    device = resolve_device(cfg.device)
    tokenizer = tokenizer or build_default_tokenizer()
    model = build_model(cfg, tokenizer).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"[{cfg.preset}] {cfg.arch} {n_params / 1e6:.2f}M params on {device}; style mix {cfg.style_mix}")
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    valid = tasks.make_split("valid", cfg.n_valid, cfg.seed)
    budget_s = cfg.max_minutes * 60 or float("inf")
    best, history, t0, data = None, [], time.perf_counter(), batches(cfg, tokenizer)
    step = 0
    while True:
        progress = max(step / cfg.steps, (time.perf_counter() - t0) / budget_s)
        done = progress >= 1.0
        if step and (step % cfg.eval_every == 0 or done):
            best = _eval_and_select(model, tokenizer, valid, cfg, step, best, history, log)
        if done:
            break
        loss = _optimizer_step(model, opt, next(data), device, cfg.lr * lr_factor(progress, step, cfg.warmup_steps))
        step += 1
        if step % cfg.log_every == 0 or step == 1:
            elapsed = time.perf_counter() - t0
            log(f"[{cfg.preset}] step {step}/{cfg.steps} loss {loss:.4f} "
                f"lr {opt.param_groups[0]['lr']:.2e} {elapsed:.0f}s ({progress:.0%})")
    if best is not None:
        model.load_state_dict(best["state"])
    summary = {"config": dataclasses.asdict(cfg), "params": n_params, "device": device,
               "steps": step, "seconds": time.perf_counter() - t0, "history": history,
               "selected": {k: v for k, v in (best or {}).items() if k != "state"}}
    save(model, tokenizer, cfg, summary)
    log(f"[{cfg.preset}] saved to {cfg.out}; selected {summary['selected']}")
    return summary


def _optimizer_step(model, opt, batch, device, lr: float) -> float:
    """One update at learning rate ``lr`` (gradients clipped to norm 1); returns the batch's loss."""
    import torch

    for group in opt.param_groups:
        group["lr"] = lr
    loss = step_loss(model, batch, device)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def _eval_and_select(model, tokenizer, valid, cfg, step, best, history, log):
    from hf_rstitch.toyworld.evaluate import evaluate

    model.eval()
    ev = evaluate(model, tokenizer, valid, batch_size=cfg.batch_size,
                  max_new_tokens=cfg.max_new_tokens)
    entry = {"step": step, "accuracy": ev["accuracy"], "mean_tokens": ev["mean_tokens"]}
    if cfg.eval_other_style:
        other = "concise" if cfg.own_style == "verbose" else "verbose"
        entry["other_accuracy"] = evaluate(model, tokenizer, valid, batch_size=cfg.batch_size,
                                           max_new_tokens=cfg.max_new_tokens,
                                           opener=tasks.opening_word(other))["accuracy"]
    model.train()
    history.append(entry)
    log(f"[{cfg.preset}] step {step} valid accuracy {ev['accuracy']:.3f}"
        + (f" (opened {other}: {entry['other_accuracy']:.3f})" if cfg.eval_other_style else "")
        + f" mean tokens {ev['mean_tokens']:.1f} ({ev['seconds']:.1f}s)")
    if _select(best, ev["accuracy"], cfg.max_valid_accuracy, entry.get("other_accuracy")):
        state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        return {**entry, "state": state}
    return best


def save(model, tokenizer, cfg: TrainConfig, summary: dict) -> Path:
    """save_pretrained in ``cfg.save_dtype`` (config says float32: load default), + tokenizer."""
    import torch

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    model = copy.deepcopy(model).to("cpu", dtype=getattr(torch, cfg.save_dtype))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.max_new_tokens = 400
    model.generation_config.do_sample = False
    model.save_pretrained(out, safe_serialization=True)
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    config["dtype"] = "float32"  # weights are stored in half precision; compute in float32
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    tokenizer.save_pretrained(out)
    (out / "training_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return out
