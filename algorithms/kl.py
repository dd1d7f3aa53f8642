"""KL estimators on sampled tokens and exact divergences on enumerable distributions.

Estimators (Schulman 2020, "Approximating KL divergence"), with r = pi_ref / pi on the
sampled token, so that each is a sample of KL(pi || ref) when the token comes from pi:

    k1 = -log r          unbiased, high variance, can be negative
    k2 = (log r)^2 / 2   biased, low variance
    k3 = r - 1 - log r   unbiased, non-negative; under pi its mean is UKL(pi || ref)
                         (paper App. D), under pi_old it is UKL(pi_old || pi) when ref = pi

and the peer frameworks' variants (algorithms/peers.py maps their option values here):

    abs = |log r|                verl's `abs`
    low_var_kl = clamped k3      verl's `low_var_kl` (and its `k3`): log r clamped to
                                 [-20, 20], the value to [-10, 10]; equal to k3 (value and
                                 gradient) wherever |log r| < 20 and k3 < 10
    k1+, abs+, k3+, low_var_kl+  straight-through: the value of the named estimator, the
                                 gradient of k2 (verl's "+" suffix)

An estimator's *value* is all that a KL placed in the reward uses (it is detached); its
*gradient* is all that matters in the loss. What each setting's expected gradient equals is
decided exactly by `python -m algorithms.certify`.

Exact forms take full probability tensors (last dim = outcomes) and are used by the
audit and the tests; the unnormalized KL (UKL) adds the mass term sum(q - p).
"""

from __future__ import annotations

import torch

from .config import DIVERGENCES, ESTIMATORS, LossConfig

# name -> f(log r) with log r = ref_logp - logp: [B, T] -> [B, T]
ESTIMATORS.register("k1", lambda log_r: -log_r)
ESTIMATORS.register("k2", lambda log_r: 0.5 * log_r**2)
ESTIMATORS.register("k3", lambda log_r: torch.expm1(log_r) - log_r)  # expm1: precise at r ~ 1
ESTIMATORS.register("abs", lambda log_r: log_r.abs())

# verl core_algos.kl_penalty_forward's bounds "for numerical stability": they only bite where
# pi and ref differ by e^20 on a token or k3 exceeds 10; there the gradient is zero.
LOW_VAR_LOG_R_BOUND = 20.0
LOW_VAR_VALUE_BOUND = 10.0


def _low_var_kl(log_r: torch.Tensor) -> torch.Tensor:
    x = log_r.clamp(-LOW_VAR_LOG_R_BOUND, LOW_VAR_LOG_R_BOUND)
    return (torch.expm1(x) - x).clamp(-LOW_VAR_VALUE_BOUND, LOW_VAR_VALUE_BOUND)


ESTIMATORS.register("low_var_kl", _low_var_kl)


def _straight_through(value_of):
    """k2's gradient under `value_of`'s value: k2 - SG(k2) + SG(k)."""
    def estimate(log_r: torch.Tensor) -> torch.Tensor:
        k2 = 0.5 * log_r**2
        return k2 - k2.detach() + value_of(log_r).detach()
    return estimate


for _name in ("k1", "abs", "k3", "low_var_kl"):  # k2+ would be k2 itself
    ESTIMATORS.register(f"{_name}+", _straight_through(ESTIMATORS[_name]))


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(pi || ref) sample. logp, ref_logp: [B, T] -> [B, T]."""
    estimate = ESTIMATORS.get(estimator)
    return estimate(ref_logp - logp)


def kl_reward_penalty(
    cfg: LossConfig, logp: torch.Tensor, ref_logp: torch.Tensor | None, mask: torch.Tensor
) -> torch.Tensor | None:
    """Per-token penalty beta * k(rollout policy vs ref) for a KL placed in the reward.

    logp: [B, T] log-probs of the policy that generated the batch (no grad);
    ref_logp: [B, T] or None (reference = rollout policy, so the penalty is zero).
    Returns [B, T] (zero off the mask), or None when cfg puts no KL in the reward.
    """
    if cfg.kl_placement != "reward":
        return None
    if ref_logp is None:
        return torch.zeros_like(logp)
    return cfg.beta * kl_estimate(logp.detach(), ref_logp.detach(), cfg.estimator) * mask


# --- exact divergences on enumerable distributions (audit, tests) --------------------------


def kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) = sum p log(p / q) over the last dim."""
    return (p * (p.log() - q.log())).sum(-1)


def ukl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Unnormalized KL(p || q) = sum p log(p / q) - p + q (equals KL for normalized p, q)."""
    return (p * (p.log() - q.log()) - p + q).sum(-1)


def divergence(name: str, pi: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """The regularizer D(pi, ref) named by a LossConfig.divergence (registered with its
    surrogate in `algorithms/losses.py`)."""
    return DIVERGENCES.get(name).exact(pi, ref)
