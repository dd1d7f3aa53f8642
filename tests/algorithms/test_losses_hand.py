"""Hand-computed values: each surrogate, its gradient coefficient, aggregation, metrics."""

import math

import pytest
import torch

from algorithms import LossConfig, aggregate, compute_policy_loss

W, Q, A, BETA = 1.25, 0.8, 2.0, 0.1
LOG_RHO = math.log(W / Q)
# (loss value, d loss / d log pi) for the differentiable surrogate, by hand from the surrogate table in algorithms/losses.py
HAND = {
    "fkl": (-W * A - BETA * Q * math.log(W), -W * A - BETA * Q),
    "ufkl": (-W * A + BETA * (W - Q * math.log(W)), -W * A + BETA * (W - Q)),
    "rkl": (W * (-A + BETA * LOG_RHO), -W * A + BETA * W * (LOG_RHO + 1)),
    "urkl": (-W * A + BETA * (W * LOG_RHO - W), -W * A + BETA * W * LOG_RHO),
}


def one_token(div, form):
    old = torch.tensor([[math.log(0.4)]], dtype=torch.float64)
    logp = (old + math.log(W)).requires_grad_(True)
    ref = old + math.log(Q)
    cfg = LossConfig(objective="rpg", divergence=div, form=form, beta=BETA)
    loss, metrics = compute_policy_loss(cfg, logp, old, ref, torch.tensor([A], dtype=torch.float64),
                                        torch.ones(1, 1))
    (grad,) = torch.autograd.grad(loss, logp)
    return loss, grad, metrics


@pytest.mark.parametrize("div", list(HAND))
def test_differentiable_surrogate_value_and_gradient(div):
    loss, grad, metrics = one_token(div, "differentiable")
    value, coef = HAND[div]
    assert float(loss) == pytest.approx(value, rel=1e-12)
    assert float(grad) == pytest.approx(coef, rel=1e-12)
    assert float(metrics["is_weight_mean"]) == pytest.approx(W, rel=1e-12)


@pytest.mark.parametrize("div", list(HAND))
def test_reinforce_form_is_stop_gradient_of_the_same_coefficient(div):
    loss, grad, _ = one_token(div, "reinforce")
    _, coef = HAND[div]
    assert float(grad) == pytest.approx(coef, rel=1e-12)
    # value: -SG(c) * log pi with c = -coef
    assert float(loss) == pytest.approx(coef * math.log(0.4 * W), rel=1e-12)


def test_grpo_k3_penalty_value_and_weights():
    old = torch.tensor([[math.log(0.4)]], dtype=torch.float64)
    logp = (old + math.log(W)).requires_grad_(True)
    ref = old + math.log(Q)
    r = Q / W  # ref / pi
    k3 = r - 1 - math.log(r)
    for iw, factor, dk in [("none", 1.0, 1 - r), ("detached", W, W * (1 - r)),
                           ("differentiable", W, W * (k3 + 1 - r))]:
        cfg = LossConfig(objective="ppo", estimator="k3", kl_placement="loss", beta=BETA,
                         kl_importance_weight=iw)
        loss, m = compute_policy_loss(cfg, logp, old, ref, torch.zeros(1, dtype=torch.float64),
                                      torch.ones(1, 1))
        (g,) = torch.autograd.grad(loss, logp)
        assert float(m["kl_loss"]) == pytest.approx(BETA * factor * k3, rel=1e-12), iw
        assert float(g) == pytest.approx(BETA * dk, rel=1e-12), iw
        assert float(m["kl_ref_k3"]) == pytest.approx(k3, rel=1e-12)
        assert float(m["kl_ref_k1"]) == pytest.approx(-math.log(r), rel=1e-12)
        assert float(m["kl_behav_k1"]) == pytest.approx(math.log(W), rel=1e-12)


def test_aggregation_modes_by_hand():
    v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert float(aggregate(v, mask, "token-mean")) == pytest.approx(10 / 4)
    assert float(aggregate(v, mask, "seq-mean-token-mean")) == pytest.approx((2 + 4) / 2)
    assert float(aggregate(v, mask, "seq-mean-token-sum")) == pytest.approx((6 + 4) / 2)
    assert float(aggregate(v, mask, "seq-mean-token-sum-norm", norm_len=5)) == pytest.approx(10 / 10)
    with pytest.raises(ValueError, match="agg"):
        aggregate(v, mask, "sum")


def test_padding_tokens_do_not_contribute():
    torch.manual_seed(0)
    logp = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    old = logp.detach() + 0.1
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    cfg = LossConfig(objective="rpg", divergence="urkl", beta=0.1)
    loss, m = compute_policy_loss(cfg, logp, old, None, torch.tensor([1.0, -1.0]), mask)
    (g,) = torch.autograd.grad(loss, logp)
    assert torch.all(g[mask == 0] == 0) and torch.all(g[mask == 1] != 0)
    garbage = old.clone()
    garbage[mask == 0] = 50.0  # huge ratios on padding must not leak into metrics
    _, m2 = compute_policy_loss(cfg, logp, garbage, None, torch.tensor([1.0, -1.0]), mask)
    assert float(m2["is_weight_max"]) == pytest.approx(float(m["is_weight_max"]))


def test_shape_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="same"):
        compute_policy_loss(LossConfig(objective="ppo"), torch.zeros(2, 3), torch.zeros(2, 4),
                            None, torch.zeros(2), torch.ones(2, 3))
