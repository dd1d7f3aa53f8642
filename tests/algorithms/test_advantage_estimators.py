"""Advantage estimators against hand-computed values."""

import math

import pytest
import torch

from algorithms import LossConfig, compute_advantages, kl_reward_penalty

R = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
G = torch.tensor([0, 0, 0, 1, 1, 2])


def test_group_mean_and_dr_grpo():
    # a group of one keeps its raw reward (mean 0, std 1: the verl convention)
    expected = torch.tensor([2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 1.0])
    for name in ("group_mean", "dr_grpo"):
        assert torch.allclose(compute_advantages(R, G, name), expected, atol=1e-6)


def test_group_zscore_uses_unbiased_std_and_leaves_singletons():
    adv = compute_advantages(R, G, "group_zscore")
    std0 = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)
    assert adv[0].item() == pytest.approx((2 / 3) / (std0 + 1e-6), rel=1e-5)
    assert adv[3].item() == 0.0  # all-equal group
    assert adv[5].item() == pytest.approx(1.0, rel=1e-5)  # group of one: mean 0, std 1


def test_batch_mean_and_reinforce_pp():
    assert torch.allclose(compute_advantages(R, G, "batch_mean"), R - 4 / 6)
    w = compute_advantages(R, G, "reinforce_pp")  # no mask: one value per sequence
    assert w.mean().abs() < 1e-6 and (w.std() - 1).abs() < 1e-6


def test_reinforce_pp_baseline_whitens_over_tokens():
    """Hand-computed: one group, R = (1, 0), lengths 3 and 1. Centred scores (0.5, -0.5) on
    4 tokens: mean 0.25, unbiased variance 0.75 / 3 = 0.25, so the long correct response
    gets +0.5 per token and the short wrong one -1.5 (sequence whitening would give +-1)."""
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    adv = compute_advantages(torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([0, 0]),
                             "reinforce_pp_baseline", mask=mask)
    scale = 1 / math.sqrt(0.25 + 1e-8)
    expected = torch.tensor([[0.25, 0.25, 0.25], [-0.75, 0, 0]], dtype=torch.float64) * scale
    assert torch.allclose(adv, expected, rtol=1e-12, atol=0)
    plain = compute_advantages(torch.tensor([1.0, 0.0], dtype=torch.float64),
                               torch.tensor([0, 1]), "reinforce_pp", mask=mask)
    assert torch.allclose(plain, torch.tensor([[1.0, 1, 1], [-3, 0, 0]],
                                              dtype=torch.float64) * 0.25 * scale, rtol=1e-12)


def test_token_returns_with_kl_in_reward():
    rewards = torch.tensor([1.0, 0.0])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    pen = torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.5, 9.0]])
    adv = compute_advantages(rewards, torch.tensor([0, 1]), "batch_mean", mask=mask,
                             token_penalty=pen)
    returns = torch.tensor([[1 - 0.6, 1 - 0.5, 1 - 0.3], [-1.0, -0.5, 0.0]])
    assert torch.allclose(adv, (returns - 0.5) * mask, atol=1e-6)
    whitened = compute_advantages(rewards, torch.tensor([0, 0]), "reinforce_pp_baseline",
                                  mask=mask, token_penalty=pen)
    valid = whitened[mask.bool()]
    assert valid.mean().abs() < 1e-6 and whitened[1, 2] == 0


def test_reward_penalty_only_for_reward_placement():
    lp, ref, mask = torch.zeros(1, 2), torch.tensor([[-0.5, 0.5]]), torch.ones(1, 2)
    cfg = LossConfig(objective="ppo", estimator="k1", kl_placement="reward", beta=0.1)
    assert torch.allclose(kl_reward_penalty(cfg, lp, ref, mask), torch.tensor([[0.05, -0.05]]))
    assert kl_reward_penalty(LossConfig(objective="ppo"), lp, ref, mask) is None


def test_unknown_estimator_lists_registered():
    with pytest.raises(ValueError, match="group_zscore"):
        compute_advantages(R, G, "gae")
