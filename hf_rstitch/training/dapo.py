"""DAPO for the router, as pure functions over plain tensors (the seed paper's Eqs. 6-9).

* :func:`reward` -- ``R = r_acc + r_eff`` with ``r_eff = -lambda * r_acc * L_hat`` (Eqs. 6-7):
  latency is penalised only on correct trajectories.
* :func:`group_advantages` -- ``A_i = (R_i - mean(R)) / std(R)`` within each group of G
  rollouts of one prompt (Eq. 8; sample standard deviation, as TRL's GRPO).
* :func:`dynamic_sampling_mask` -- DAPO's dynamic sampling: groups whose rewards are all
  equal carry no signal (zero advantages) and are skipped.
* :func:`dapo_loss` -- the clipped surrogate with decoupled clip range ``[1 - eps_low,
  1 + eps_high]`` (DAPO's clip-higher), normalised over all decisions of a group
  (token-level, Eq. 9), averaged over groups.

A "token" here is a router decision: one consultation on one uncertain SLM step.
"""

from __future__ import annotations

import torch


def reward(correct: torch.Tensor, latency_ms: torch.Tensor, lam: float) -> torch.Tensor:
    """Latency-aware reward (Eqs. 6-7).

    Args:
        correct: ``[...]`` r_acc, 1.0 for a correct final answer else 0.0.
        latency_ms: ``[...]`` L_hat, the trajectory latency predicted by the latency model (ms).
        lam: lambda, reward per millisecond saved (the paper: 5e-6 for trajectories of tens of seconds).

    Returns:
        ``[...]`` R = r_acc - lam * r_acc * L_hat.
    """
    r_acc = correct.float()
    return r_acc - lam * r_acc * latency_ms.float()


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6, scale: bool = True) -> torch.Tensor:
    """Group-normalised advantages (Eq. 8).

    Args:
        rewards: ``[P, G]`` one row per prompt, G rollouts each.
        eps: added to the standard deviation; groups with equal rewards get zero advantages.
        scale: divide by the group's std (Eq. 8). ``False`` keeps ``R - mean`` (Dr. GRPO): with a
            continuous latency term, std scaling blows the small latency spread of an all-correct
            group up to unit advantages, as large as a correct-vs-wrong split elsewhere.

    Returns:
        ``[P, G]`` (R - mean) / (std + eps), std with Bessel's correction (or R - mean).
    """
    mean = rewards.mean(dim=-1, keepdim=True)
    if not scale:
        return rewards - mean
    std = rewards.std(dim=-1, keepdim=True) if rewards.shape[-1] > 1 else torch.zeros_like(mean)
    return (rewards - mean) / (std + eps)


def dynamic_sampling_mask(rewards: torch.Tensor, tol: float = 1e-9) -> torch.Tensor:
    """``[P]`` bool: groups whose rewards are not all equal (DAPO keeps only these)."""
    return (rewards.max(dim=-1).values - rewards.min(dim=-1).values) > tol


def clipped_objective(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                      eps_low: float = 0.2, eps_high: float = 0.28) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-decision ``min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)`` and whether it was clipped.

    Args:
        logp: ``[N]`` log pi_theta(a | s) under the current router (differentiable).
        old_logp: ``[N]`` log pi_theta_old(a | s) recorded at rollout time.
        adv: ``[N]`` the advantage of the trajectory each decision belongs to.

    Returns:
        (objective ``[N]``, clipped ``[N]`` bool: the clipped branch was the smaller one).
    """
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    return torch.minimum(unclipped, clipped), clipped < unclipped


def dapo_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, group: torch.Tensor,
              eps_low: float = 0.2, eps_high: float = 0.28) -> tuple[torch.Tensor, dict[str, float]]:
    """Negative DAPO objective (Eq. 9) over the decisions of several groups.

    Each group's objective is the sum over all decisions of all its G trajectories divided by
    their number (token-level normalisation: long trajectories weigh more than in a
    per-trajectory mean); the loss is minus the mean over groups.

    Args:
        logp / old_logp / adv: ``[N]`` per decision (see :func:`clipped_objective`).
        group: ``[N]`` long, the group (prompt) each decision belongs to.

    Returns:
        (scalar loss, stats: ``clip_frac``, ``ratio_mean``).
    """
    if logp.numel() == 0:
        return logp.sum() * 0.0, {"clip_frac": 0.0, "ratio_mean": 1.0}
    obj, was_clipped = clipped_objective(logp, old_logp, adv, eps_low, eps_high)
    ids, inverse = torch.unique(group, return_inverse=True)
    per_group = torch.zeros(len(ids), dtype=obj.dtype, device=obj.device).index_add_(0, inverse, obj)
    counts = torch.zeros(len(ids), dtype=obj.dtype, device=obj.device).index_add_(0, inverse, torch.ones_like(obj))
    loss = -(per_group / counts).mean()
    with torch.no_grad():
        stats = {"clip_frac": float(was_clipped.float().mean()), "ratio_mean": float(torch.exp(logp - old_logp).mean())}
    return loss, stats
