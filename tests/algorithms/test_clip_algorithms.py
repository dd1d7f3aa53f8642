"""Algorithm 1 (dual clip, differentiable) and Algorithm 2 (RPG-Style Clip, REINFORCE):
every branch, both advantage signs, where the gradient must be zero."""

import math

import pytest
import torch

from algorithms import ClipConfig, LossConfig, compute_policy_loss

CLIP = ClipConfig(eps_low=0.2, eps_high=0.28, dual_c=3.0)
BETA = 0.05
TINY = 1e-9
# (w, advantage, region): region None = inside the trust region
CASES = [
    (0.5, 1.0, None),  # A > 0 below 1 - eps_low: PPO lets it rise
    (1.0, 1.0, None),
    (1.28 - TINY, 1.0, None),
    (1.28 + TINY, 1.0, "upper"),
    (4.0, 1.0, "upper"),
    (0.8 - TINY, -1.0, "lower"),
    (0.8 + TINY, -1.0, None),
    (1.5, -1.0, None),  # A < 0 above 1 + eps_high: dual-clip range, gradient flows
    (3.0 - TINY, -1.0, None),
    (3.0 + TINY, -1.0, "dual"),
    (10.0, -1.0, "dual"),
]


def run(form, w, adv):
    old = torch.tensor([[math.log(0.3)]], dtype=torch.float64)
    logp = (old + math.log(w)).requires_grad_(True)
    cfg = LossConfig(objective="rpg", divergence="urkl", form=form, beta=BETA, clip=CLIP)
    loss, m = compute_policy_loss(cfg, logp, old, None, torch.tensor([adv], dtype=torch.float64),
                                  torch.ones(1, 1))
    (g,) = torch.autograd.grad(loss, logp)
    return loss, float(g), m


def kl_coef(w):  # d/dlogp of beta * (w log w - w) with q = 1
    return BETA * w * math.log(w)


@pytest.mark.parametrize("form", ["reinforce", "differentiable"])
@pytest.mark.parametrize("w, adv, region", CASES)
def test_dual_clip_algorithms(form, w, adv, region):
    """Inside the trust region both forms give the unclipped gradient. Clipped, Algorithm 2
    (RPG-Style Clip, REINFORCE form) drops the whole token's weight; Algorithm 1 (dual clip,
    differentiable form) keeps the KL term's gradient and clips the loss value."""
    loss, g, m = run(form, w, adv)
    if region is None:
        assert g == pytest.approx(-w * adv + kl_coef(w), rel=1e-9)
    elif form == "reinforce":
        assert g == 0.0  # the whole token's weight is dropped
    else:
        assert g == pytest.approx(kl_coef(w), rel=1e-9, abs=1e-15)  # KL term still flows
        bound = {"upper": 1.28, "lower": 0.8, "dual": 3.0}[region]
        kl_value = BETA * (w * math.log(w) - w)
        assert float(loss) == pytest.approx(-adv * bound + kl_value, rel=1e-6)
    for name in ("upper", "lower", "dual"):
        assert float(m[f"clip_frac_{name}"]) == (1.0 if region == name else 0.0)


def test_ppo_value_equals_max_min_formula():
    """The explicit-region form equals PPO's max(-Aw, -A clip(w)), min(., -Ac) for A < 0."""
    w = torch.tensor([0.3, 0.9, 1.1, 1.6, 5.0] * 2, dtype=torch.float64)
    adv = torch.tensor([1.0] * 5 + [-1.0] * 5, dtype=torch.float64)
    old = torch.full((10, 1), math.log(0.1), dtype=torch.float64)
    cfg = LossConfig(objective="ppo", clip=CLIP, agg="seq-mean-token-sum")
    loss, _ = compute_policy_loss(cfg, old + w.log()[:, None], old, None, adv, torch.ones(10, 1))
    ppo = torch.maximum(-adv * w, -adv * w.clamp(0.8, 1.28))
    ppo = torch.where(adv < 0, torch.minimum(ppo, -adv * 3.0), ppo)
    assert float(loss) == pytest.approx(float(ppo.mean()), rel=1e-12)
