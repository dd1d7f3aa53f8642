"""The released RPG code's `rpg_js` / `rpg_ujs` (verl/trainer/ppo/core_algos.py `kl_penalty`):
registered as divergences "js" and "ujs", pinned by hand, and what they are exactly."""

from __future__ import annotations

import torch

from algorithms import LossConfig, compute_policy_loss
from algorithms.config import DIVERGENCES
from algorithms.kl import divergence, kl, ukl

BETA = 0.3


def _tokens():
    logw = torch.tensor([[0.2, -0.4, 0.0]], dtype=torch.float64)
    logq = torch.tensor([[0.1, 0.3, 0.0]], dtype=torch.float64)
    return logw, logq


def test_js_and_ujs_surrogates_by_hand():
    """L_KL = beta/2 (w (log w - log q) - q log w); at q = 1 it is the released
    0.5 (w log w - log w) with w = pi/ref; ujs is the same function."""
    logw, logq = _tokens()
    w, q = logw.exp(), logq.exp()
    by_hand = 0.5 * (w * (logw - logq) - q * logw)
    for name in ("js", "ujs"):
        torch.testing.assert_close(DIVERGENCES[name].surrogate(logw, logq), by_hand, rtol=1e-14,
                                   atol=1e-16)
    released = 0.5 * (w * logw - logw)  # the released expression, ref = old (q = 1)
    torch.testing.assert_close(DIVERGENCES["js"].surrogate(logw, torch.zeros_like(logw)),
                               released, rtol=1e-14, atol=1e-16)


def test_js_loss_value_and_reinforce_gradient_by_hand():
    """Both forms, one outcome of three tokens, A = 0: the differentiable loss is the mean of
    beta L_KL; the REINFORCE form's gradient on log pi is -c / 3 per token with
    c = -beta/2 (w (log w - log q + 1) - q)."""
    logw, logq = _tokens()
    w, q = logw.exp(), logq.exp()
    old = torch.full_like(logw, -1.0)
    adv, mask = torch.zeros(1, dtype=torch.float64), torch.ones_like(logw)
    cfg = LossConfig(objective="rpg", divergence="js", beta=BETA, clip=None)
    logp = (old + logw).requires_grad_(True)
    loss, _ = compute_policy_loss(cfg, logp, old, old + logq, adv, mask)
    by_hand = BETA * 0.5 * (w * (logw - logq) - q * logw)
    torch.testing.assert_close(loss, by_hand.mean(), rtol=1e-14, atol=0)
    rf = cfg.model_copy(update={"form": "reinforce"})
    logp = (old + logw).requires_grad_(True)
    compute_policy_loss(rf, logp, old, old + logq, adv, mask)[0].backward()
    c = -BETA * 0.5 * (w * (logw - logq + 1) - q)
    torch.testing.assert_close(logp.grad, -c / 3, rtol=1e-14, atol=0)


def test_what_the_released_js_measures():
    """Not Jensen-Shannon: the mean of the two KL directions (half Jeffreys), and ujs the
    mean of the two unnormalized ones, equal on normalized distributions."""
    pi = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    ref = torch.tensor([0.4, 0.4, 0.2], dtype=torch.float64)
    torch.testing.assert_close(divergence("js", pi, ref), 0.5 * (kl(pi, ref) + kl(ref, pi)))
    torch.testing.assert_close(divergence("ujs", pi, ref), divergence("js", pi, ref))
    mass = torch.tensor([0.3, 0.6, 0.4], dtype=torch.float64)  # unnormalized: they differ
    torch.testing.assert_close(divergence("ujs", mass, ref),
                               0.5 * (ukl(mass, ref) + ukl(ref, mass)))
    m = 0.5 * (pi + ref)
    jensen_shannon = 0.5 * (kl(pi, m) + kl(ref, m))
    assert abs(float(divergence("js", pi, ref) - jensen_shannon)) > 1e-2
