"""DAPO pieces against hand-computed numbers."""

import math

import pytest
import torch

from hf_rstitch.training.dapo import clipped_objective, dapo_loss, dynamic_sampling_mask, group_advantages, reward


def test_reward_penalises_latency_only_when_correct():
    r = reward(torch.tensor([1.0, 1.0, 0.0]), torch.tensor([1000.0, 200.0, 50.0]), lam=5e-4)
    assert torch.allclose(r, torch.tensor([1 - 0.5, 1 - 0.1, 0.0]))


def test_group_advantages_hand_values():
    # mean 0.25, sample std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0]]), eps=0.0 + 1e-12)
    assert torch.allclose(adv[0], torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-6)
    assert torch.equal(adv[1], torch.zeros(4))  # equal rewards: no signal


def test_dynamic_sampling_skips_equal_groups():
    rewards = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.9, 0.7, 0.9], [0.0, 1.0, 0.0]])
    assert dynamic_sampling_mask(rewards).tolist() == [False, False, True, True]


def test_clip_higher_is_decoupled():
    old = torch.zeros(4)
    ratio = torch.tensor([1.5, 1.5, 0.5, 0.5])
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    obj, clipped = clipped_objective(ratio.log(), old, adv, eps_low=0.2, eps_high=0.28)
    # A > 0: min(1.5, 1.28) = 1.28 ; A < 0: min(-1.5, -1.28) = -1.5 ; A > 0: min(0.5, 0.8) = 0.5 ; A < 0: min(-0.5, -0.8) = -0.8
    assert torch.allclose(obj, torch.tensor([1.28, -1.5, 0.5, -0.8]))
    assert clipped.tolist() == [True, False, False, True]


def test_dapo_loss_token_level_normalisation():
    # group 0: three decisions (two from one trajectory), group 1: one decision; ratio 1 everywhere
    adv = torch.tensor([1.0, 1.0, -2.0, 4.0])
    group = torch.tensor([0, 0, 0, 1])
    zeros = torch.zeros(4, requires_grad=True)
    loss, stats = dapo_loss(zeros, torch.zeros(4), adv, group)
    # group 0: (1 + 1 - 2) / 3 = 0 ; group 1: 4 / 1 ; loss = -(0 + 4) / 2
    assert math.isclose(loss.item(), -2.0)
    assert stats["clip_frac"] == 0.0 and stats["ratio_mean"] == 1.0
    loss.backward()
    # d loss / d logp_i = -(A_i / n_group(i)) / n_groups  (ratio = 1, unclipped)
    assert torch.allclose(zeros.grad, torch.tensor([-1 / 6, -1 / 6, 2 / 6, -2.0]))


def test_dapo_loss_clipped_decisions_have_no_gradient():
    logp = torch.log(torch.tensor([1.5, 0.5])).requires_grad_(True)
    loss, stats = dapo_loss(logp, torch.zeros(2), torch.tensor([1.0, -1.0]), torch.tensor([0, 0]))
    assert stats["clip_frac"] == 1.0
    loss.backward()
    assert torch.equal(logp.grad, torch.zeros(2))


def test_dapo_loss_empty():
    loss, _ = dapo_loss(torch.zeros(0), torch.zeros(0), torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert float(loss) == 0.0


@pytest.mark.parametrize("g", [2, 8])
def test_advantages_zero_mean(g):
    r = torch.rand(5, g, generator=torch.Generator().manual_seed(g), dtype=torch.float64)
    adv = group_advantages(r)
    assert torch.allclose(adv.mean(-1), torch.zeros(5, dtype=torch.float64), atol=1e-9)
    assert torch.allclose(adv.std(-1), torch.ones(5, dtype=torch.float64), atol=1e-4)  # eps = 1e-6 in the divisor
    assert torch.allclose(group_advantages(r, scale=False), r - r.mean(-1, keepdim=True))
