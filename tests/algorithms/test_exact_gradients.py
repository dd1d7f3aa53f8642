"""The paper's core claims, checked exactly (float64, enumeration, rel. error < 1e-8)."""

import itertools

import pytest
import torch

from algorithms import LossConfig, compute_policy_loss, kl_estimate
from algorithms.audit import (
    CATEGORICAL,
    TREE,
    audit_one,
    exact_gradient,
    make_problem,
    surrogate_gradients,
)
from algorithms.kl import ukl

EXACT = 1e-8
DIVS = ("fkl", "ufkl", "rkl", "urkl", "js", "ujs")
FORMS = ("differentiable", "reinforce")


def rpg(div, form="differentiable", level="token", beta=0.1):
    return LossConfig(objective="rpg", divergence=div, form=form, ratio_level=level, beta=beta)


@pytest.mark.parametrize("div, form", list(itertools.product(DIVS, FORMS)))
@pytest.mark.parametrize("scenario", ["on_policy", "off_policy", "ref_differs"])
def test_every_rpg_variant_is_exact_at_a_single_step(div, form, scenario):
    res = audit_one(make_problem(CATEGORICAL, scenario, seed=1), rpg(div, form), div)
    assert res.rel_bias < EXACT
    assert res.rel_bias_kl < EXACT


@pytest.mark.parametrize("div", DIVS)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_differentiable_and_reinforce_forms_have_identical_per_sample_gradients(div, level):
    """Prop. 4.1: not only equal in expectation, equal outcome by outcome."""
    p = make_problem(TREE, "ref_differs", seed=2)
    g_diff, _ = surrogate_gradients(p, rpg(div, "differentiable", level))
    g_rf, _ = surrogate_gradients(p, rpg(div, "reinforce", level))
    assert torch.allclose(g_diff, g_rf, rtol=1e-10, atol=1e-14)
    assert g_diff.abs().max() > 1e-3  # the comparison is not vacuous


def test_k3_is_the_unnormalized_kl_appendix_d():
    g = torch.Generator().manual_seed(3)
    pi = torch.softmax(torch.randn(6, generator=g, dtype=torch.float64), -1)
    old = torch.softmax(torch.randn(6, generator=g, dtype=torch.float64), -1)
    ref = torch.rand(6, generator=g, dtype=torch.float64) + 0.1  # unnormalized measure
    # under pi, k3 of (pi, ref) averages to UKL(pi || ref)
    k3_pi = kl_estimate(pi.log(), ref.log(), "k3")
    assert torch.isclose((pi * k3_pi).sum(), ukl(pi, ref), rtol=EXACT)
    # under pi_old, with the current policy as the "reference" slot: UKL(pi_old || pi)
    k3_old = kl_estimate(old.log(), pi.log(), "k3")
    assert torch.isclose((old * k3_old).sum(), ukl(old, pi), rtol=EXACT)
    assert abs(float(ukl(pi, ref))) > 1e-2


def grpo_k3(iw):
    return LossConfig(objective="ppo", estimator="k3", kl_placement="loss",
                      kl_importance_weight=iw, beta=0.1)


def test_grpo_unweighted_k3_is_biased_off_policy():
    res = audit_one(make_problem(CATEGORICAL, "off_policy", seed=0), grpo_k3("none"), "rkl")
    assert res.rel_bias_kl > 0.05


def test_grpo_unweighted_k3_on_policy_descends_the_forward_kl():
    p = make_problem(CATEGORICAL, "on_policy", seed=0)
    g, mu = surrogate_gradients(p, grpo_k3("none"), with_reward=False)
    forward = exact_gradient(p, "fkl", 0.1, with_reward=False)
    reverse = exact_gradient(p, "rkl", 0.1, with_reward=False)
    assert torch.allclose(mu @ g, -forward, rtol=EXACT, atol=1e-14)
    assert (mu @ g + reverse).norm() > 1e-3 * reverse.norm()


@pytest.mark.parametrize("scenario", ["on_policy", "off_policy", "ref_differs"])
def test_differentiably_weighted_k3_is_exact_for_reverse_kl(scenario):
    res = audit_one(make_problem(CATEGORICAL, scenario, seed=0), grpo_k3("differentiable"), "rkl")
    assert res.rel_bias < EXACT and res.rel_bias_kl < EXACT


@pytest.mark.parametrize("div, form", list(itertools.product(DIVS, FORMS)))
@pytest.mark.parametrize("scenario", ["on_policy", "off_policy", "ref_differs"])
def test_sequence_level_ratios_are_exact_on_the_tree(div, form, scenario):
    res = audit_one(make_problem(TREE, scenario, seed=4), rpg(div, form, "sequence"), div)
    assert res.rel_bias < EXACT


@pytest.mark.parametrize("div", ["fkl", "ufkl"])
def test_token_level_forward_kl_part_is_exact_on_the_tree(div):
    res = audit_one(make_problem(TREE, "off_policy", seed=4), rpg(div), div)
    assert res.rel_bias_kl < EXACT


@pytest.mark.parametrize("div", ["rkl", "urkl", "js", "ujs"])  # js: half a reverse KL
def test_token_level_reverse_kl_is_biased_at_second_order(div):
    at_old = audit_one(make_problem(TREE, "at_old", seed=4), rpg(div), div)
    assert at_old.rel_bias_kl < EXACT  # zero at theta = theta_old
    off = audit_one(make_problem(TREE, "off_policy", seed=4, delta=0.5), rpg(div), div)
    assert off.rel_bias_kl > 1e-2  # clearly nonzero at |delta| ~ 0.5
    near = audit_one(make_problem(TREE, "off_policy", seed=4, delta=0.05), rpg(div), div)
    assert near.rel_bias_kl < off.rel_bias_kl / 5  # shrinks faster than delta (second order)


@pytest.mark.parametrize("div", DIVS)
def test_unnormalized_regularizers_have_zero_variance_at_theta_old(div):
    res = audit_one(make_problem(CATEGORICAL, "at_old", seed=5), rpg(div), div)
    # the released "js" is already of the unnormalized kind: its coefficient
    # (w (log rho + 1) - q) / 2 vanishes at w = q = 1, as ujs's (the same function)
    if div.startswith("u") or div == "js":
        assert res.variance_kl < 1e-20
    else:
        assert res.variance_kl > 1e-6


def test_per_outcome_call_matches_batched_call():
    """Token-sum aggregation is linear in samples: one batched call equals the sum."""
    g = torch.Generator().manual_seed(6)
    logp = torch.randn(5, 3, generator=g, dtype=torch.float64).requires_grad_(True)
    old = logp.detach() + 0.3 * torch.randn(5, 3, generator=g, dtype=torch.float64)
    adv = torch.randn(5, generator=g, dtype=torch.float64)
    mask = torch.ones(5, 3, dtype=torch.float64)
    cfg = rpg("urkl").model_copy(update={"agg": "seq-mean-token-sum"})
    loss, _ = compute_policy_loss(cfg, logp, old, None, adv, mask)
    parts = sum(compute_policy_loss(cfg, logp[i:i+1], old[i:i+1], None, adv[i:i+1], mask[i:i+1])[0]
                for i in range(5)) / 5
    assert torch.isclose(loss, parts, rtol=1e-12)
