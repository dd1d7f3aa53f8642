"""Off-policy correction for the sampler mismatch: the engine samples from mu, the loss
assumes the trainer's recomputed pi_old (docs/algorithms.md, "Off-policy corrections").

    c = correct(old_logp, mu_logp, mask, mode="token_tis", cap=2.0)
    c.weight     # [B, T] stop-gradient factor multiplying every per-token loss term
    c.behaviour  # [B, T] log-probs the loss's ratios are taken against (pi_old, or mu)
    c.metrics    # CORRECTION_METRICS, detached 0-dim tensors

Decoupled, as verl's `algorithm.rollout_correction` and TRL's `vllm_importance_sampling_mode`:
the clip's trust region stays measured against pi_old; the correction is a separate factor
built from the ratio r = pi_old / mu of the sampled tokens. Modes (`CORRECTIONS`):

    none       weight 1 (today: pi_old is taken as the sampler)
    token_tis  weight min(r_t, cap)                           (truncated IS)
    token_mis  weight r_t if 1/cap <= r_t <= cap, else 0      (masked IS, IcePop's form)
    seq_tis    weight min(R, cap) on every token of the sequence, R = prod_t r_t
    seq_mis    weight R if 1/cap <= R <= cap, else 0
    sampler    weight 1, and mu replaces pi_old in every ratio of the loss (exact)

The sequence modes use the product R, not its geometric mean: R is the sequence's exact
importance weight (unbiased before truncation), the geometric mean is a length-normalised
proxy that is biased even where nothing is truncated. With mu == pi_old every r is exactly
1, so every mode is the identity. Pure torch, no host sync.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from pydantic import BaseModel, ConfigDict, Field

from .registry import Registry

# The metrics `correct` returns: the one list of their names (logged once per step).
CORRECTION_METRICS = ("correction_ratio_mean", "correction_ratio_max", "correction_frac_truncated",
                      "correction_frac_masked", "correction_ess", "correction_kl_mu_old")


class ModeWeights(NamedTuple):
    """What one mode makes of the log-ratios: the weight, and which units it cut."""

    weight: torch.Tensor  # [B, T] (token modes) or [B, 1] (sequence modes)
    truncated: torch.Tensor  # bool, same shape: weight capped
    masked: torch.Tensor  # bool, same shape: weight set to 0


# name -> f(token log-ratios [B, T] (0 off the mask), mask [B, T] bool, log cap) -> ModeWeights
CORRECTIONS: Registry[Callable[[torch.Tensor, torch.Tensor, float], ModeWeights]] = Registry(
    "rollout.correction.mode")
SEQUENCE_MODES = ("seq_tis", "seq_mis")


def _identity(log_r: torch.Tensor, mask: torch.Tensor, log_cap: float) -> ModeWeights:
    none = torch.zeros_like(mask)
    return ModeWeights(torch.ones_like(log_r), none, none)


def _truncate(log_r: torch.Tensor, log_cap: float) -> ModeWeights:
    cut = log_r > log_cap
    return ModeWeights(log_r.clamp(max=log_cap).exp(), cut, torch.zeros_like(cut))


def _mask(log_r: torch.Tensor, log_cap: float) -> ModeWeights:
    out = (log_r > log_cap) | (log_r < -log_cap)
    return ModeWeights(torch.where(out, 0.0, log_r.clamp(-log_cap, log_cap).exp()),
                       torch.zeros_like(out), out)


def _sequence(log_r: torch.Tensor) -> torch.Tensor:
    return log_r.sum(-1, keepdim=True)  # log R, [B, 1]


CORRECTIONS.register("none", _identity)
CORRECTIONS.register("token_tis", lambda log_r, mask, log_cap: _truncate(log_r, log_cap))
CORRECTIONS.register("token_mis", lambda log_r, mask, log_cap: _mask(log_r, log_cap))
CORRECTIONS.register("seq_tis", lambda log_r, mask, log_cap: _truncate(_sequence(log_r), log_cap))
CORRECTIONS.register("seq_mis", lambda log_r, mask, log_cap: _mask(_sequence(log_r), log_cap))
CORRECTIONS.register("sampler", _identity)  # exact: the loss takes mu as its behaviour policy

CorrectionMode = CORRECTIONS.Name


class CorrectionConfig(BaseModel):
    """`rollout.correction`: how the loss corrects for the sampler mu differing from pi_old."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: CorrectionMode = Field(
        "none", description="none, token_tis, token_mis, seq_tis, seq_mis (weights from "
        "pi_old/mu, sequence modes on the product ratio) or sampler (mu replaces pi_old in "
        "every ratio of the loss); docs/algorithms.md")
    cap: float = Field(2.0, gt=1.0, description="the TIS truncation min(ratio, cap); MIS "
                       "keeps ratios inside [1/cap, cap]")


class Correction(NamedTuple):
    """The correction of one batch (`correct`)."""

    weight: torch.Tensor  # [B, T] stop-gradient factor on every per-token loss term
    keep: torch.Tensor  # [B, T] bool: the tokens the MIS modes keep (all, otherwise)
    behaviour: torch.Tensor  # [B, T] log-probs every ratio of the loss is taken against
    metrics: dict[str, torch.Tensor]  # CORRECTION_METRICS


def correct(old_logp: torch.Tensor, mu_logp: torch.Tensor, mask: torch.Tensor,
            mode: str = "none", cap: float = 2.0) -> Correction:
    """The correction of `mode` for tokens sampled from mu (log-probs `mu_logp`, [B, T])
    while the trainer recomputed pi_old (`old_logp`), on the response tokens `mask`.

    Metrics: mean and max of the token ratio pi_old/mu; the fraction of the mode's units
    (tokens, or sequences for seq_*) truncated or masked; the normalised effective sample
    size (sum w)^2 / (n sum w^2) of the weights the mode leaves (of the raw ratio for none
    and sampler, as a diagnostic); KL(mu || pi_old) per token by the k3 estimator of
    r = pi_old/mu under mu (unbiased, >= 0).
    """
    if old_logp.shape != mu_logp.shape or old_logp.shape != mask.shape:
        raise ValueError(f"old_logp {tuple(old_logp.shape)}, mu_logp {tuple(mu_logp.shape)} "
                         f"and mask {tuple(mask.shape)} must have the same [B, T] shape")
    old_logp, mu_logp = old_logp.detach(), mu_logp.detach()
    on = mask.bool()
    log_r = torch.where(on, old_logp - mu_logp, 0.0)
    w = CORRECTIONS.get(mode)(log_r, on, math.log(cap))
    units = on.any(-1, keepdim=True) if mode in SEQUENCE_MODES else on
    weight = torch.where(on, w.weight.expand_as(log_r), 0.0)
    keep = on & ~w.masked.expand_as(on)
    behaviour = mu_logp if mode == "sampler" else old_logp
    ess_w = w.weight if mode not in ("none", "sampler") else log_r.exp()
    metrics = _metrics(log_r, on, units, w, ess_w)
    return Correction(weight, keep, behaviour, metrics)


@torch.no_grad()
def _metrics(log_r, on, units, w: ModeWeights, ess_w) -> dict[str, torch.Tensor]:
    r = log_r.exp()
    n_tokens = on.sum().to(r.dtype).clamp_min(1.0)
    n_units = units.sum().to(r.dtype).clamp_min(1.0)
    ess_w = torch.where(units, ess_w, 0.0)
    ess = ess_w.sum() ** 2 / (n_units * (ess_w**2).sum()).clamp_min(torch.finfo(r.dtype).tiny)
    return {
        "correction_ratio_mean": torch.where(on, r, 0.0).sum() / n_tokens,
        "correction_ratio_max": torch.where(on, r, float("-inf")).max(),
        "correction_frac_truncated": (w.truncated & units).sum().to(r.dtype) / n_units,
        "correction_frac_masked": (w.masked & units).sum().to(r.dtype) / n_units,
        "correction_ess": ess,
        "correction_kl_mu_old": torch.where(on, r - 1.0 - log_r, 0.0).sum() / n_tokens,
    }
