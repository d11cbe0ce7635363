"""``train_router(config)``: DAPO training of the R-Stitch+ router with a latency-aware reward.

One step: take ``batch_prompts`` prompts, sample ``group_size`` routed trajectories of each in
one batched stitched ``generate`` call (:mod:`.rollout`), reward them with ``R = r_acc -
lambda * r_acc * L_hat`` (L_hat from the latency model, ms), drop the groups whose rewards are
all equal, and take ``epochs`` gradient steps on the DAPO loss (:mod:`.dapo`). The LLM and SLM
are frozen; only the router learns.

Departures from DAPO as published: dynamic sampling *skips* zero-variance groups instead of
drawing more prompts until the batch is full (the batch shrinks; ``kept_groups`` is logged);
no overlong-response shaping (the decoding budget is the task's); no KL term (as DAPO).

Output folder: ``metrics.jsonl`` (one line per step), ``checkpoint/`` (router, optimizer,
step, RNG; resumed automatically), ``router/`` (final, ``Router.from_pretrained``-loadable),
``latency.json`` (the latency model used) and ``config.json``.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any, Callable

import torch

from .config import RouterTrainConfig
from .dapo import dapo_loss, dynamic_sampling_mask, group_advantages, reward
from .model import Router
from .rollout import Grader, Trajectory, default_grader, encode_prompts, rollout

# --- set-up ----------------------------------------------------------------------------------------


def resolve_device(device: str) -> str:
    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device


def load_models(cfg: RouterTrainConfig, device: str):
    """(llm, slm, tokenizer), float32, eval mode, frozen."""
    if not cfg.llm:
        from ..toyworld.pair import load_pair

        llm, slm, tok = load_pair(device)
    else:
        from ..eval.api import load_pair
        from ..eval.config import EvalConfig

        llm, slm, tok = load_pair(EvalConfig(llm=cfg.llm, slm=cfg.slm, data=["-"], dtype="float32"), device)
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


def save_checkpoint(path: Path, router: Router, optimizer, step: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    router.save_pretrained(path / "router")
    torch.save({"optimizer": optimizer.state_dict(), "step": step, "torch_rng": torch.get_rng_state(),
                "python_rng": random.getstate()}, path / "trainer_state.pt")


def load_checkpoint(path: Path, router: Router, optimizer) -> int:
    state = torch.load(path / "trainer_state.pt", weights_only=False)
    loaded = Router.from_pretrained(str(path / "router"))
    router.load_state_dict(loaded.state_dict())
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    return int(state["step"])


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
    device = resolve_device(cfg.device)
    if llm is None or slm is None or tokenizer is None:
        llm, slm, tokenizer = load_models(cfg, device)
    device = str(next(llm.parameters()).device)
    rows = load_rows(cfg) if rows is None else rows
    if grader is None:  # the toy world's answers are plain integers in \boxed{}
        from ..toyworld.pair import grade as toy_grade

        grader = toy_grade if not (cfg.llm or cfg.data) else default_grader
    if latency_model is None:
        latency_model = load_latency_model(cfg, llm, slm, out)
    latency_model.save(out / "latency.json")
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1) + "\n")

    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    hidden = slm.config.get_text_config().hidden_size
    router = Router(hidden, cfg.width, cfg.num_blocks, threshold=cfg.threshold, llm_bias=cfg.llm_bias).to(device)
    optimizer = torch.optim.AdamW(router.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    start = 0
    if cfg.resume and (out / "checkpoint" / "trainer_state.pt").exists():
        start = load_checkpoint(out / "checkpoint", router, optimizer)
        log(f"resumed from {out / 'checkpoint'} at step {start}")
    router.eval()
    prompts = encode_prompts(tokenizer, [r["problem"] for r in rows], cfg.instruction)
    answers = [str(r["answer"]) for r in rows]
    t_start, step = time.perf_counter(), start
    with open(out / "metrics.jsonl", "a") as metrics_file:
        for step in range(start, cfg.steps):
            t0 = time.perf_counter()
            idx = batch_indices(len(rows), cfg.batch_prompts, step, cfg.seed)
            groups = rollout(llm, slm, tokenizer, router, [prompts[i] for i in idx], [answers[i] for i in idx],
                             group_size=cfg.group_size, threshold=cfg.threshold, latency_model=latency_model,
                             max_new_tokens=cfg.max_new_tokens, do_sample=cfg.do_sample,
                             temperature=cfg.temperature, top_p=cfg.top_p, grader=grader)
            t_roll = time.perf_counter() - t0
            stats = update(router, optimizer, groups, cfg)
            m = {"step": step + 1, **step_metrics(groups, cfg.lam), **stats,
                 "rollout_s": t_roll, "step_s": time.perf_counter() - t0}
            metrics_file.write(json.dumps(m) + "\n")
            metrics_file.flush()
            if cfg.progress:
                log(f"step {step + 1}/{cfg.steps} reward {m['reward']:.3f} acc {m['accuracy']:.3f} "
                    f"llm_share {m['llm_token_share']:.3f} L_hat {m['latency_ms']:.1f}ms "
                    f"votes_llm {m['llm_vote_rate']:.3f} kept {m['kept_groups']}/{len(groups)} "
                    f"loss {m['loss']:.4f} ({m['step_s']:.1f}s)")
            done = step + 1
            timed_out = cfg.max_minutes > 0 and time.perf_counter() - t_start > 60 * cfg.max_minutes
            if done % cfg.checkpoint_every == 0 or done == cfg.steps or timed_out:
                save_checkpoint(out / "checkpoint", router, optimizer, done)
            if timed_out:
                log(f"stopping after {cfg.max_minutes} min at step {done} (resume with the same --out)")
                break
    router.save_pretrained(out / "router")
    return router
