"""``train_router(config)``: DAPO training of the R-Stitch+ router with a latency-aware reward.

One step: take ``batch_prompts`` prompts, sample ``group_size`` routed trajectories of each in
one batched stitched ``generate`` call (:mod:`.rollout`), reward them with ``R = r_acc -
lambda * r_acc * L_hat`` (L_hat from the latency model, ms), drop the groups whose rewards are
all equal, and take ``epochs`` gradient steps on the DAPO loss (:mod:`.dapo`). The LLM and SLM
are frozen; only the router learns.

Departures from DAPO as published: dynamic sampling *skips* zero-variance groups instead of
drawing more prompts until the batch is full (the batch shrinks; ``kept_groups`` is logged);
no overlong-response shaping (the decoding budget is the task's); no KL term (as DAPO).

Output folder: ``metrics.jsonl`` (one line per step; after a resume, lines past the checkpoint
are dropped before the steps re-run), ``checkpoint/trainer.pt`` (router, optimizer, step and RNG
in one file written atomically, loaded with ``weights_only=True``; resumed automatically),
``router/`` (final, ``Router.from_pretrained``-loadable), ``latency.json`` (the latency model
used) and ``config.json``.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ..hf.loading import resolve_device
from ..router.config import RouterTrainConfig
from .dapo import dapo_loss, dynamic_sampling_mask, group_advantages, reward
from ..router.model import Router
from .rollout import Grader, Trajectory, default_grader, encode_prompts, rollout

# --- set-up ----------------------------------------------------------------------------------------


def load_models(cfg: RouterTrainConfig, device: str):
    """(llm, slm, tokenizer), float32, eval mode, frozen."""
    from ..hf.loading import load_pair
    from ..resources import resolve

    llm, slm, tok = load_pair(resolve(cfg.llm or "shipped:llm"), resolve(cfg.slm or "shipped:slm"), "float32", device)
    for m in (llm, slm):
        m.requires_grad_(False)
        if getattr(m.generation_config, "stitch_threshold", None) is not None:
            m.generation_config.stitch_threshold = None
    return llm, slm, tok


def load_rows(cfg: RouterTrainConfig) -> list[dict[str, Any]]:
    if cfg.data:
        from ..eval.data import load_problems

        return [{"problem": p.problem, "answer": p.answer} for p in load_problems(cfg.data)]
    from ..toyworld.tasks import make_split

    return make_split("train", cfg.n_train, cfg.seed)


def load_latency_model(cfg: RouterTrainConfig, llm, slm, out: Path):
    from ..latency import LatencyModel

    if cfg.latency_profile != "auto":
        return LatencyModel.load(cfg.latency_profile)
    if (out / "latency.json").exists():
        return LatencyModel.load(out / "latency.json")
    from ..latency.profiler import profile_model

    grid = {"n_inf": (1, 2, 8, 32, 128), "n_kv": (0, 64, 256, 512)}
    lm = LatencyModel({role: profile_model(m, **grid, repeats=5, warmup=3, progress=False)
                       for role, m in (("slm", slm), ("llm", llm))})
    lm.save(out / "latency.json")
    return lm


# --- one step --------------------------------------------------------------------------------------


def group_rewards(groups: list[list[Trajectory]], lam: float) -> torch.Tensor:
    """``[P, G]`` rewards of a batch of groups."""
    correct = torch.tensor([[t.correct for t in g] for g in groups], dtype=torch.float32)
    latency = torch.tensor([[t.latency_ms for t in g] for g in groups], dtype=torch.float64)
    return reward(correct, latency, lam)


def flatten_decisions(groups: list[list[Trajectory]], adv: torch.Tensor, keep: torch.Tensor):
    """(hidden [N, D], actions [N], old_logp [N], adv [N], group [N]) over the kept groups."""
    parts = [(t.decisions, float(adv[g, i]), g) for g, grp in enumerate(groups) if keep[g]
             for i, t in enumerate(grp) if len(t.decisions)]
    if not parts:
        return None
    hidden = torch.cat([d.hidden for d, _, _ in parts])
    actions = torch.cat([d.actions for d, _, _ in parts])
    old = torch.cat([d.logp for d, _, _ in parts])
    advs = torch.cat([torch.full((len(d),), a) for d, a, _ in parts])
    group = torch.cat([torch.full((len(d),), g, dtype=torch.long) for d, _, g in parts])
    return hidden, actions, old, advs, group


def update(router: Router, optimizer, groups: list[list[Trajectory]], cfg: RouterTrainConfig) -> dict[str, float]:
    """DAPO update on one batch of groups; returns loss statistics."""
    rewards = group_rewards(groups, cfg.lam)
    keep = dynamic_sampling_mask(rewards)
    adv = group_advantages(rewards, scale=cfg.scale_advantages)
    stats: dict[str, float] = {"kept_groups": int(keep.sum()), "loss": 0.0, "clip_frac": 0.0, "decisions_used": 0}
    flat = flatten_decisions(groups, adv, keep)
    if flat is None:
        return stats
    device = router.head.weight.device
    hidden, actions, old, advs, group = (x.to(device) for x in flat)
    router.train()
    for _ in range(cfg.epochs):
        logp = router.log_probs(hidden).gather(1, actions[:, None]).squeeze(1)
        loss, st = dapo_loss(logp, old, advs.float(), group, cfg.eps_low, cfg.eps_high)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(router.parameters(), cfg.max_grad_norm)
        optimizer.step()
    router.eval()
    stats.update(loss=loss.item(), clip_frac=st["clip_frac"], decisions_used=int(actions.numel()))
    return stats


def step_metrics(groups: list[list[Trajectory]], lam: float) -> dict[str, float]:
    trajs = [t for g in groups for t in g]
    n = len(trajs)
    decisions = sum(len(t.decisions) for t in trajs)
    votes = sum(int(t.decisions.actions.sum()) for t in trajs)
    return {
        "reward": float(group_rewards(groups, lam).mean()),
        "accuracy": sum(t.correct for t in trajs) / n,
        "llm_token_share": sum(t.llm_tokens for t in trajs) / max(1, sum(t.new_tokens for t in trajs)),
        "latency_ms": sum(t.latency_ms for t in trajs) / n,
        "new_tokens": sum(t.new_tokens for t in trajs) / n,
        "decisions_per_traj": decisions / n,
        "llm_vote_rate": votes / max(1, decisions),
    }


# --- checkpoints -----------------------------------------------------------------------------------

CHECKPOINT = "trainer.pt"  # one file: router weights, optimizer, step and RNG states of one step
LEGACY_STATE = "trainer_state.pt"  # the old two-file layout (router/ + trainer_state.pt)


def save_checkpoint(path: Path, router: Router, optimizer, step: int) -> None:
    """Write everything a resume needs into one file, atomically (temp file + ``os.replace``):
    a kill leaves either the previous checkpoint or this one, never a mix of two steps."""
    path.mkdir(parents=True, exist_ok=True)
    state = {"step": step, "router": router.state_dict(), "optimizer": optimizer.state_dict(),
             "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(),
             "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}
    atomic_torch_save(state, path / CHECKPOINT)


def atomic_torch_save(obj: Any, target: Path) -> None:
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def load_checkpoint(path: Path, router: Router, optimizer) -> int:
    """Restore router, optimizer and RNG states saved by :func:`save_checkpoint`; returns the step.

    Loaded with ``torch.load(weights_only=True)``: tensors and plain containers only, so a
    crafted file cannot run code."""
    file = path / CHECKPOINT
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
        router.load_state_dict(state["router"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
    except (pickle.UnpicklingError, RuntimeError, KeyError, TypeError, ValueError, EOFError) as err:
        raise ValueError(f"cannot resume from {file}: {err}. The checkpoint is corrupt or was made with other "
                         "router settings (--width, --num-blocks, another SLM); use another --out, or --no-resume "
                         "to start over in this one.") from None
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    if state.get("cuda_rng") and torch.cuda.is_available() and len(state["cuda_rng"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return step


def find_checkpoint(out: Path) -> Path | None:
    """``out/checkpoint`` if it holds a resumable checkpoint; refuses the old two-file layout."""
    folder = out / "checkpoint"
    if (folder / CHECKPOINT).exists():
        return folder
    if (folder / LEGACY_STATE).exists():
        raise ValueError(f"{folder} holds an old-format checkpoint ({LEGACY_STATE}, loaded by pickle and written "
                         "in two steps, so it cannot be resumed safely). Delete that folder to start over, pass "
                         "--no-resume, or use another --out.")
    return None


def trim_metrics(path: Path, last_step: int) -> None:
    """Keep only the metric lines of steps ``<= last_step`` (the steps the resumed state has seen),
    so steps re-run after a resume are not logged twice. Rewritten atomically."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if int(json.loads(line)["step"]) <= last_step:
                keep.append(line)
        except (ValueError, KeyError, TypeError):  # a torn last line from a kill
            continue
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(x + "\n" for x in keep))
    os.replace(tmp, path)


# --- the loop --------------------------------------------------------------------------------------


def batch_indices(n_rows: int, batch: int, step: int, seed: int) -> list[int]:
    """Deterministic epoch-wise shuffled prompt indices for ``step`` (resume-safe)."""
    per_epoch = max(1, n_rows // batch)
    epoch, k = divmod(step, per_epoch)
    order = list(range(n_rows))
    random.Random(seed + epoch).shuffle(order)
    return order[k * batch:(k + 1) * batch] or order[:batch]


def train_router(cfg: RouterTrainConfig, *, llm=None, slm=None, tokenizer=None, latency_model=None,
                 rows: list[dict] | None = None, grader: Grader | None = None,
                 log: Callable[[str], None] = print) -> Router:
    """Train (or resume training) a router; returns it. Models/data may be passed in (tests)."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = load_rows(cfg) if rows is None else rows  # a bad data file fails before the models load
    if llm is None or slm is None or tokenizer is None:
        llm, slm, tokenizer = load_models(cfg, resolve_device(cfg.device))
    if grader is None:  # the toy world's answers are plain integers in \boxed{}
        from ..toyworld.pair import grade as toy_grade

        grader = toy_grade if not (cfg.llm or cfg.data) else default_grader
    if latency_model is None:
        latency_model = load_latency_model(cfg, llm, slm, out)
    latency_model.save(out / "latency.json")
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1) + "\n")
    router, optimizer, start = _router_and_optimizer(cfg, slm, str(next(llm.parameters()).device), out, log)
    prompts = encode_prompts(tokenizer, [r["problem"] for r in rows], cfg.instruction)
    answers = [str(r["answer"]) for r in rows]
    t_start = time.perf_counter()
    with open(out / "metrics.jsonl", "a") as metrics_file:
        for step in range(start, cfg.steps):
            idx = batch_indices(len(rows), cfg.batch_prompts, step, cfg.seed)
            m, groups = _train_step(cfg, llm, slm, tokenizer, router, optimizer, latency_model, grader,
                                    [prompts[i] for i in idx], [answers[i] for i in idx], step)
            metrics_file.write(json.dumps(m) + "\n")
            metrics_file.flush()
            if cfg.progress:
                log(_progress_line(m, cfg.steps, groups))
            done = step + 1
            timed_out = cfg.max_minutes > 0 and time.perf_counter() - t_start > 60 * cfg.max_minutes
            if done % cfg.checkpoint_every == 0 or done == cfg.steps or timed_out:
                save_checkpoint(out / "checkpoint", router, optimizer, done)
            if timed_out:
                log(f"stopping after {cfg.max_minutes} min at step {done} (resume with the same --out)")
                break
    router.save_pretrained(out / "router")
    return router


def _router_and_optimizer(cfg: RouterTrainConfig, slm, device: str, out: Path, log) -> tuple[Router, Any, int]:
    """A fresh router (seeded) and its optimizer, or both resumed from ``out``'s last checkpoint; the first step to
    run. Metrics past that step (written after the checkpoint) are dropped."""
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    hidden = slm.config.get_text_config().hidden_size
    router = Router(hidden, cfg.width, cfg.num_blocks, threshold=cfg.threshold, llm_bias=cfg.llm_bias).to(device)
    optimizer = torch.optim.AdamW(router.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    start = 0
    checkpoint = find_checkpoint(out) if cfg.resume else None
    if checkpoint is not None:
        start = load_checkpoint(checkpoint, router, optimizer)
        log(f"resumed from {checkpoint} at step {start}")
    trim_metrics(out / "metrics.jsonl", start)
    router.eval()
    return router, optimizer, start


def _train_step(cfg: RouterTrainConfig, llm, slm, tokenizer, router: Router, optimizer, latency_model, grader,
                prompts: list, answers: list[str], step: int) -> tuple[dict, int]:
    """One DAPO step: roll out groups on ``prompts``, update the router; the step's metrics and its groups."""
    t0 = time.perf_counter()
    groups = rollout(llm, slm, tokenizer, router, prompts, answers, group_size=cfg.group_size,
                     threshold=cfg.threshold, latency_model=latency_model, max_new_tokens=cfg.max_new_tokens,
                     do_sample=cfg.do_sample, temperature=cfg.temperature, top_p=cfg.top_p, grader=grader)
    t_roll = time.perf_counter() - t0
    stats = update(router, optimizer, groups, cfg)
    return {"step": step + 1, **step_metrics(groups, cfg.lam), **stats, "rollout_s": t_roll,
            "step_s": time.perf_counter() - t0}, len(groups)


def _progress_line(m: dict, steps: int, groups: int) -> str:
    return (f"step {m['step']}/{steps} reward {m['reward']:.3f} acc {m['accuracy']:.3f} "
            f"llm_share {m['llm_token_share']:.3f} L_hat {m['latency_ms']:.1f}ms "
            f"votes_llm {m['llm_vote_rate']:.3f} kept {m['kept_groups']}/{groups} "
            f"loss {m['loss']:.4f} ({m['step_s']:.1f}s)")
