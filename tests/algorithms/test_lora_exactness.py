"""LoRA changes the parameterisation, not the losses: a surrogate whose gradient is exact with
respect to the policy's logits is exact with respect to adapter parameters too (chain rule
through W0 + B A, a map that does not depend on the sampled outcome). Checked by enumeration
in float64 on a linear-softmax policy whose only trainable parameters are a rank-1 adapter,
with the reference the base model (adapters off: GRPO's fixed reference under LoRA) or
another adapter state, sampled off-policy."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
import torch

from algorithms import LossConfig
from algorithms.audit import Problem, audit_one, exact_gradient, surrogate_gradients

EXACT = 1e-8
K, D, T = 5, 3, 2  # outcomes per token, features, tokens (a two-token tree: K*K sequences)
DIVS = ("fkl", "ufkl", "rkl", "urkl")
FORMS = ("differentiable", "reinforce")


@dataclass(frozen=True)
class AdaptedSoftmax:
    """Token t's logits over K tokens: (W0 + b a^T) x_t, x_1 a fixed feature vector and x_2
    one per first token; only the rank-1 adapter theta = (a (D,), b (K,)) is a parameter,
    the frozen W0 (K, D) is not. theta with b = 0 is the base model."""

    w0: torch.Tensor  # (K, D)
    x_first: torch.Tensor  # (D,)
    x_second: torch.Tensor  # (K, D): the second token's features, by first token
    n_params: int = D + K
    n_outcomes: int = K * K
    n_tokens: int = T

    def token_logps(self, theta: torch.Tensor) -> torch.Tensor:
        a, b = theta[:D], theta[D:]
        w = self.w0 + b[:, None] * a[None, :]  # (K, D): the merged weight
        first = torch.log_softmax(w @ self.x_first, -1)  # (K,)
        second = torch.log_softmax(self.x_second @ w.T, -1)  # (K first tokens, K)
        i = torch.arange(K).repeat_interleave(K)  # first token of each sequence
        j = torch.arange(K).repeat(K)
        return torch.stack([first[i], second[i, j]], -1)  # (K*K, 2)

    def seq_probs(self, theta: torch.Tensor) -> torch.Tensor:
        return self.token_logps(theta).sum(-1).exp()


def problem(reference: str, seed: int = 0) -> Problem:
    g = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return scale * torch.randn(*shape, generator=g, dtype=torch.float64)

    policy = AdaptedSoftmax(randn(K, D), randn(D), randn(K, D))
    theta = randn(D + K)  # the adapter now
    old = theta + randn(D + K, scale=0.5)  # the sampler: an older adapter (off-policy)
    ref = (torch.cat([randn(D), torch.zeros(K, dtype=torch.float64)]) if reference == "base"
           else theta + randn(D + K, scale=0.5))  # base: adapters off (b = 0)
    return Problem(policy, theta, old, ref, randn(K * K))


def rpg(div: str, form: str, level: str) -> LossConfig:
    return LossConfig(objective="rpg", divergence=div, form=form, ratio_level=level, beta=0.1)


@pytest.mark.parametrize("div, form", list(itertools.product(DIVS, FORMS)))
@pytest.mark.parametrize("reference", ["base", "refreshed"])
def test_rpg_surrogates_are_exact_in_the_adapter_parameters(div, form, reference):
    """Sequence-level ratios: exact for every RPG divergence and form (as for full
    parameters, tests/algorithms/test_exact_gradients.py)."""
    res = audit_one(problem(reference), rpg(div, form, "sequence"), div)
    assert res.rel_bias < EXACT and res.rel_bias_kl < EXACT


@pytest.mark.parametrize("reference", ["base", "refreshed"])
def test_the_comparison_is_not_vacuous(reference):
    """The adapter gradient is large, and a biased surrogate is told apart here too (GRPO's
    unweighted k3 off-policy)."""
    p = problem(reference)
    assert exact_gradient(p, "rkl", 0.1).norm() > 1e-2
    grpo = LossConfig(objective="ppo", estimator="k3", kl_placement="loss",
                      kl_importance_weight="none", beta=0.1)
    assert audit_one(p, grpo, "rkl").rel_bias_kl > 1e-2
    g, mu = surrogate_gradients(p, rpg("urkl", "reinforce", "sequence"))
    assert g.shape == (K * K, D + K) and torch.isclose(mu.sum(), torch.tensor(1.0,
                                                                              dtype=mu.dtype))
