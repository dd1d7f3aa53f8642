"""Algorithm 2 (RPG-Style Clip) branches on the effective advantage A' = A + C_KL / w.

The expected values come from the paper's Algorithm 2 (App. G), written out here in plain
float64 arithmetic, independently of `algorithms.losses`: with c = w A + C_KL the token's
stop-gradient weight (the coefficient of grad log pi, DESIGN table) and A' = c / w,

    A' >= 0: the gradient flows while w < 1 + eps_high;
    A' <  0: no gradient when w <= 1 - eps_low or w >= c_dual; it flows in between;

the loss value is c * l inside and SG(bound * A') * l in a clipped region, l = -log pi.
"""

import math

import pytest
import torch

from algorithms import ClipConfig, LossConfig, compute_policy_loss
from algorithms.clipping import clip_regions

CLIP = ClipConfig(eps_low=0.2, eps_high=0.28, dual_c=10.0)
DIVERGENCES = ("fkl", "ufkl", "rkl", "urkl")
BOUNDARIES = (1 - CLIP.eps_low, 1 + CLIP.eps_high, CLIP.dual_c)
W_POINTS = sorted({0.3, 0.5, 1.0, 2.0, 20.0, *BOUNDARIES,
                   *(b * (1 + s * 1e-9) for b in BOUNDARIES for s in (-1, 1))})


def kl_weight(div: str, w: float, beta: float) -> float:
    """C_KL: the KL part of the coefficient of grad log pi, reference = sampler (q = 1)."""
    return {"fkl": beta, "ufkl": -beta * (w - 1.0), "rkl": -beta * w * (math.log(w) + 1.0),
            "urkl": -beta * w * math.log(w)}[div]


def paper_algorithm2(div: str, w: float, adv: float, beta: float, ell: float):
    """(gradient of the loss w.r.t. log pi, loss value) per the paper's Algorithm 2."""
    c = w * adv + kl_weight(div, w, beta)
    a_eff = c / w
    if a_eff >= 0:
        flows, bound = w < 1 + CLIP.eps_high, 1 + CLIP.eps_high
    else:
        flows = 1 - CLIP.eps_low < w < CLIP.dual_c
        bound = 1 - CLIP.eps_low if w <= 1 - CLIP.eps_low else CLIP.dual_c
    return (-c if flows else 0.0), (c * ell if flows else bound * a_eff * ell)


def log_of(w: float) -> torch.Tensor:
    """A float64 x with exp(x) == w bit for bit where one exists (0.8 and 1.28 have one), so
    boundary cases sit exactly on the bound; else the x whose exp(x) is nearest to w."""
    x = torch.tensor(math.log(w), dtype=torch.float64)
    best = x
    for _ in range(64):
        got = float(torch.exp(x))
        if got == w:
            return x
        if abs(got - w) < abs(float(torch.exp(best)) - w):
            best = x
        x = torch.nextafter(x, torch.tensor(math.inf if got < w else -math.inf, dtype=x.dtype))
    return best


def ours(div: str, w: float, adv: float, beta: float):
    """(gradient w.r.t. log pi, loss value, metrics) of our loss for one token with
    pi_old = 1, so that log pi = log w exactly and l = -log w."""
    cfg = LossConfig(objective="rpg", divergence=div, form="reinforce", beta=beta, clip=CLIP,
                     agg="seq-mean-token-sum")
    logp = log_of(w).reshape(1, 1).requires_grad_(True)
    loss, metrics = compute_policy_loss(cfg, logp, torch.zeros(1, 1, dtype=torch.float64), None,
                                        torch.tensor([adv], dtype=torch.float64), torch.ones(1, 1))
    (grad,) = torch.autograd.grad(loss, logp)
    return float(grad), float(loss.detach()), metrics


@pytest.mark.parametrize("div", DIVERGENCES)
@pytest.mark.parametrize("adv", [0.0, 1.0, -1.0, 0.02, -0.02])
@pytest.mark.parametrize("w", W_POINTS)
def test_algorithm2_matches_the_paper_on_every_branch(div, adv, w):
    """Both sides of every boundary, the boundaries themselves, A = 0, and small |A| where
    the KL part flips the sign of A' (beta = 0.05 makes C_KL / w comparable to A)."""
    beta, x = 0.05, log_of(w)
    grad, loss, _ = ours(div, w, adv, beta)
    want_grad, want_loss = paper_algorithm2(div, float(torch.exp(x)), adv, beta, ell=-float(x))
    assert grad == pytest.approx(want_grad, rel=1e-12, abs=1e-300)
    assert loss == pytest.approx(want_loss, rel=1e-12, abs=1e-300)


def test_the_issue_examples_at_zero_advantage():
    """A = 0, the paper's beta: URKL at w = 0.5 keeps its KL weight; FKL at w = 1.3 drops it."""
    grad, _, m = ours("urkl", 0.5, 0.0, 1e-4)
    assert -grad == pytest.approx(0.5 * 1e-4 * math.log(2.0), rel=1e-12)  # +3.47e-05
    assert float(m["clip_frac_lower"]) == 0.0
    grad, _, m = ours("fkl", 1.3, 0.0, 1e-4)
    assert grad == 0.0
    assert float(m["clip_frac_upper"]) == 1.0


def test_the_sign_of_a_prime_not_a_picks_the_branch():
    # A < 0 but C_KL / w > |A|: the positive branch, so w = 0.5 (below 1 - eps_low) flows.
    div, w, beta = "urkl", 0.5, 0.05
    adv = -0.5 * kl_weight(div, w, beta) / w
    grad, _, _ = ours(div, w, adv, beta)
    assert grad == pytest.approx(-(w * adv + kl_weight(div, w, beta)), rel=1e-12)
    assert grad != 0.0


@pytest.mark.parametrize("inclusive, clipped", [(True, True), (False, False)])
def test_lower_boundary_is_inclusive_for_algorithm2_only(inclusive, clipped):
    w = torch.tensor([1 - CLIP.eps_low], dtype=torch.float64)
    regions = clip_regions(w, torch.tensor([-1.0], dtype=torch.float64), CLIP,
                           lower_inclusive=inclusive)
    assert bool(regions.lower[0]) is clipped


def test_dual_boundary_is_inclusive():
    w = torch.tensor([CLIP.dual_c], dtype=torch.float64)
    for inclusive in (True, False):
        regions = clip_regions(w, torch.tensor([-1.0], dtype=torch.float64), CLIP,
                               lower_inclusive=inclusive)
        assert bool(regions.dual[0])


@pytest.mark.parametrize("objective, form", [("ppo", None), ("rpg", "differentiable")])
@pytest.mark.parametrize("w", [0.5, 2.0, 20.0])
def test_zero_advantage_tokens_are_not_counted_as_clipped(objective, form, w):
    """The clip cannot change a zero-advantage token's reward-term gradient (it is zero)."""
    fields = {"objective": objective, "clip": CLIP, "agg": "seq-mean-token-sum"}
    if objective == "rpg":
        fields.update(divergence="urkl", form=form, beta=1e-4)
    cfg = LossConfig(**fields)
    old = torch.zeros(1, 1, dtype=torch.float64)
    _, m = compute_policy_loss(cfg, old + math.log(w), old, None,
                               torch.zeros(1, dtype=torch.float64), torch.ones(1, 1))
    assert all(float(m[f"clip_frac_{r}"]) == 0.0 for r in ("upper", "lower", "dual"))
