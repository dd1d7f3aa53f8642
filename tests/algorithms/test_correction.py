"""algorithms.correction: each mode's weight and metrics by hand (float64), the loss it
corrects, and the identity when the sampler mu equals pi_old."""

import math

import pytest
import torch

from algorithms import LossConfig, compute_policy_loss
from algorithms.correction import CORRECTION_METRICS, CORRECTIONS, CorrectionConfig, correct

D = torch.float64
# token ratios r = pi_old / mu; row 2's last token is padding
R = [[3.0, 0.25, 1.0], [1.5, 1.5, 1.0]]
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=D)
MU = torch.log(torch.tensor([[0.1, 0.6, 0.3], [0.2, 0.4, 0.5]], dtype=D))
OLD = MU + torch.log(torch.tensor(R, dtype=D))
CAP = 2.0
# by hand: sequence ratios 3 * 0.25 * 1 = 0.75 and 1.5 * 1.5 = 2.25
HAND_WEIGHT = {
    "none": [[1, 1, 1], [1, 1, 0]],
    "token_tis": [[2, 0.25, 1], [1.5, 1.5, 0]],
    "token_mis": [[0, 0, 1], [1.5, 1.5, 0]],
    "seq_tis": [[0.75, 0.75, 0.75], [2, 2, 0]],
    "seq_mis": [[0.75, 0.75, 0.75], [0, 0, 0]],
    "sampler": [[1, 1, 1], [1, 1, 0]],
}
# (fraction truncated, fraction masked): of 5 tokens, or of 2 sequences
HAND_FRACTIONS = {"none": (0, 0), "token_tis": (1 / 5, 0), "token_mis": (0, 2 / 5),
                  "seq_tis": (1 / 2, 0), "seq_mis": (0, 1 / 2), "sampler": (0, 0)}
TOKENS = [3.0, 0.25, 1.0, 1.5, 1.5]


def ess(ws):
    return sum(ws) ** 2 / (len(ws) * sum(w * w for w in ws))


HAND_ESS = {"none": ess(TOKENS), "token_tis": ess([2, 0.25, 1, 1.5, 1.5]),
            "token_mis": ess([0, 0, 1, 1.5, 1.5]), "seq_tis": ess([0.75, 2]),
            "seq_mis": ess([0.75, 0]), "sampler": ess(TOKENS)}


def test_every_mode_has_a_hand_computed_case():
    assert set(HAND_WEIGHT) == set(CORRECTIONS) == set(HAND_ESS)


@pytest.mark.parametrize("mode", list(HAND_WEIGHT))
def test_weight_and_metrics_by_hand(mode):
    c = correct(OLD, MU, MASK, mode, CAP)
    torch.testing.assert_close(c.weight, torch.tensor(HAND_WEIGHT[mode], dtype=D),
                               rtol=1e-12, atol=0)
    assert torch.equal(c.behaviour, MU if mode == "sampler" else OLD)
    expected_keep = (torch.tensor(HAND_WEIGHT[mode]) != 0) | (mode not in ("token_mis", "seq_mis"))
    assert torch.equal(c.keep, expected_keep & MASK.bool())
    m = {k: float(v) for k, v in c.metrics.items()}
    assert list(m) == list(CORRECTION_METRICS)
    assert m["correction_ratio_mean"] == pytest.approx(sum(TOKENS) / 5, rel=1e-12)
    assert m["correction_ratio_max"] == pytest.approx(3.0, rel=1e-12)
    assert (m["correction_frac_truncated"], m["correction_frac_masked"]) == pytest.approx(
        HAND_FRACTIONS[mode], rel=1e-12)
    assert m["correction_ess"] == pytest.approx(HAND_ESS[mode], rel=1e-12)
    kl = sum(r - 1 - math.log(r) for r in TOKENS) / 5  # k3 of pi_old/mu under mu
    assert m["correction_kl_mu_old"] == pytest.approx(kl, rel=1e-12)


def test_cap_must_exceed_one_and_mode_must_be_registered():
    with pytest.raises(ValueError, match="cap"):
        CorrectionConfig(cap=1.0)
    with pytest.raises(ValueError, match="rollout.correction.mode='tis' is not registered"):
        CorrectionConfig(mode="tis")


def _reinforce_loss(mode, logp, adv):
    """Unclipped REINFORCE, no KL: loss = -sum_t SG(c_t w_t A) log pi_t / #tokens."""
    cfg = LossConfig(objective="reinforce", clip=None, kl_placement="none", beta=0.0)
    loss, _ = compute_policy_loss(cfg, logp, OLD, None, adv, MASK, mu_logp=MU,
                                  correction=CorrectionConfig(mode=mode, cap=CAP))
    (grad,) = torch.autograd.grad(loss, logp)
    return loss, grad


@pytest.mark.parametrize("mode", [m for m in HAND_WEIGHT if m != "sampler"])
def test_the_weight_multiplies_every_token_of_the_loss(mode):
    adv = torch.tensor([2.0, -1.0], dtype=D)
    logp = OLD.clone().requires_grad_(True)  # at pi_theta = pi_old: w = 1
    _, grad = _reinforce_loss(mode, logp, adv)
    expected = -torch.tensor(HAND_WEIGHT[mode], dtype=D) * adv[:, None] / 5
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-15)


def test_sampler_takes_every_ratio_against_mu():
    """Under `sampler` w = pi / mu (not pi / pi_old), and the reference stays pi_old: the
    RPG loss equals mode none's with old_logp = mu and ref_logp = pi_old, by hand too."""
    adv = torch.tensor([2.0, -1.0], dtype=D)
    cfg = LossConfig(objective="rpg", divergence="rkl", form="differentiable", beta=0.1,
                     clip=None)
    logp = (OLD + 0.1).requires_grad_(True)
    loss, _ = compute_policy_loss(cfg, logp, OLD, None, adv, MASK, mu_logp=MU,
                                  correction=CorrectionConfig(mode="sampler"))
    again, _ = compute_policy_loss(cfg, logp, MU, OLD, adv, MASK)
    assert torch.equal(loss, again)
    w = (logp - MU).exp()
    log_rho = logp - OLD
    hand = (w * (-adv[:, None] + 0.1 * log_rho) * MASK).sum() / 5  # rkl: w(-A + beta log rho)
    assert float(loss.detach()) == pytest.approx(float(hand.detach()), rel=1e-12)


LOSSES = {
    "rpg-urkl-reinforce-clip": LossConfig(objective="rpg", divergence="urkl", form="reinforce",
                                          beta=0.1),
    "rpg-fkl-sequence": LossConfig(objective="rpg", divergence="fkl", ratio_level="sequence",
                                   beta=0.1),
    "ppo-k3-in-loss": LossConfig(objective="ppo", estimator="k3", kl_placement="loss", beta=0.1),
    "gspo": LossConfig(objective="ppo", ratio_level="sequence_normalized", kl_placement="none",
                       beta=0.0),
}


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("with_ref", [False, True])
def test_every_mode_is_the_identity_when_mu_equals_pi_old(name, with_ref):
    """mu == pi_old (the hf engine): every ratio pi_old/mu is exactly 1, so every mode gives
    mode none's loss and gradient bit for bit."""
    g = torch.Generator().manual_seed(0)
    logp0 = OLD + 0.3 * torch.randn(OLD.shape, generator=g, dtype=D)
    ref = (OLD - 0.2 * torch.randn(OLD.shape, generator=g, dtype=D)) if with_ref else None
    adv = torch.tensor([1.5, -0.5], dtype=D)
    results = {}
    for mode in CORRECTIONS:
        logp = logp0.clone().requires_grad_(True)
        loss, metrics = compute_policy_loss(LOSSES[name], logp, OLD, ref, adv, MASK,
                                            mu_logp=OLD.clone(),
                                            correction=CorrectionConfig(mode=mode))
        (grad,) = torch.autograd.grad(loss, logp)
        results[mode] = (loss, grad, metrics)
    loss0, grad0, metrics0 = results["none"]
    for mode, (loss, grad, metrics) in results.items():
        assert torch.equal(loss, loss0), mode
        assert torch.equal(grad, grad0), mode
        assert all(torch.equal(metrics[k], metrics0[k]) for k in metrics0), mode
