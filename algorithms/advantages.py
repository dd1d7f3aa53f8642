"""Advantage estimators behind one registry: rewards [B] (+ group ids) -> advantages.

    group_mean             R - mean_group(R)                      (RPG; Dr. GRPO)
    dr_grpo                same as group_mean: Dr. GRPO drops GRPO's std division
    group_zscore           (R - mean_group(R)) / (std_group(R) + eps)        (GRPO)
    batch_mean             R - mean_batch(R)
    rloo                   R_i - mean_{j != i, same group} R_j      (RLOO; Ahmadian et al. 2024)
    reinforce_pp           returns whitened over all response tokens   (REINFORCE++)
    reinforce_pp_baseline  R - mean_group(R), whitened over all response tokens

The whitening estimators follow the released verl code (and OpenRLHF): the score is
broadcast over the response tokens and whitened over every token of the batch, so a long
response weighs more in the mean and variance than a short one.

With a KL placed in the reward, `token_penalty` [B, T] turns each sequence reward into
token returns G_t = R - sum_{s >= t} penalty_s (undiscounted reward-to-go), and the
estimator's baseline and scale (computed from the sequence rewards, or over all tokens for
the whitening estimators) apply to G_t; the result is then [B, T].
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .registry import Registry

EPS = 1e-6
WHITEN_EPS = 1e-8  # verl's masked_whiten


def _group_stats(rewards: torch.Tensor, group_ids: torch.Tensor):
    """Per-sample group mean and unbiased std ([B] each); a group of one has mean 0, std 1."""
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    n_groups = counts.numel()
    sums = torch.zeros(n_groups, dtype=rewards.dtype, device=rewards.device)
    sums.index_add_(0, inverse, rewards)
    mean = sums / counts
    sq = torch.zeros_like(sums).index_add_(0, inverse, (rewards - mean[inverse]) ** 2)
    std = (sq / (counts - 1).clamp_min(1)).sqrt()
    single = counts == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[inverse], std[inverse]


def token_returns(
    rewards: torch.Tensor, token_penalty: torch.Tensor | None, mask: torch.Tensor | None
) -> torch.Tensor:
    """G_t = R - sum_{s>=t} penalty_s on the mask: [B, T]; without a penalty, R as [B]."""
    if token_penalty is None:
        return rewards
    if mask is None:
        raise ValueError("token_penalty needs the response mask [B, T]")
    pen = token_penalty * mask
    to_go = pen.flip(-1).cumsum(-1).flip(-1)  # (B, T) sum over s >= t
    return (rewards[:, None] - to_go) * mask


def _centered(baseline_of: Callable, scale: bool = False):
    def estimator(rewards, group_ids, returns, mask):
        mean, std = baseline_of(rewards, group_ids)
        if returns.dim() == 2:
            mean, std = mean[:, None], std[:, None]
            out = (returns - mean) / (std + EPS) if scale else returns - mean
            return out * mask
        return (returns - mean) / (std + EPS) if scale else returns - mean

    return estimator


def _whiten(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Zero mean, unit variance over the batch, as verl's `masked_whiten`: over the masked
    response tokens when a mask is given (each sequence weighs its length; a [B] input is
    first broadcast over its tokens), else over sequences. Unbiased variance,
    (x - mean) / sqrt(var + 1e-8)."""
    if mask is None:
        return (values - values.mean()) / (values.var() + WHITEN_EPS).sqrt()
    m = mask.to(values.dtype)
    if values.dim() == 1:
        values = values[:, None] * m  # (B, T) the sequence score on each response token
    count = m.sum()
    mean = (values * m).sum() / count.clamp_min(1.0)
    var = (((values - mean) * m) ** 2).sum() / (count - 1).clamp_min(1.0)
    return (values - mean) * (var + WHITEN_EPS).rsqrt() * m


def _reinforce_pp(rewards, group_ids, returns, mask):
    return _whiten(returns, mask)


def _reinforce_pp_baseline(rewards, group_ids, returns, mask):
    mean, _ = _group_stats(rewards, group_ids)
    return _whiten(returns - (mean[:, None] if returns.dim() == 2 else mean), mask)


def _leave_one_out(rewards, group_ids):
    """Per-sample mean of the *other* rewards of its group (and scale 1): RLOO's baseline,
    K/(K-1) times group_mean's centring; a group of one has baseline 0, as the released
    `compute_rloo_outcome_advantage` leaves a lone sample's score unchanged."""
    mean, _ = _group_stats(rewards, group_ids)
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    n = counts[inverse].to(rewards.dtype)  # (B,) group size of each sample
    others = torch.where(n > 1, (mean * n - rewards) / (n - 1).clamp_min(1.0),
                         torch.zeros_like(rewards))
    return others, torch.ones_like(rewards)


def _batch(rewards, group_ids):
    return rewards.mean().expand_as(rewards), torch.ones_like(rewards)


ADVANTAGE_ESTIMATORS: Registry[Callable] = Registry("advantage estimator")
for _name, _fn in {
    "group_mean": _centered(_group_stats),
    "dr_grpo": _centered(_group_stats),
    "group_zscore": _centered(_group_stats, scale=True),
    "batch_mean": _centered(_batch),
    "rloo": _centered(_leave_one_out),
    "reinforce_pp": _reinforce_pp,
    "reinforce_pp_baseline": _reinforce_pp_baseline,
}.items():
    ADVANTAGE_ESTIMATORS.register(_name, _fn)


def compute_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    estimator: str,
    *,
    mask: torch.Tensor | None = None,
    token_penalty: torch.Tensor | None = None,
) -> torch.Tensor:
    """Advantages [B] (or [B, T] with a token penalty). rewards: [B] float; group_ids: [B]
    (samples of the same prompt share an id); mask, token_penalty: [B, T]."""
    fn = ADVANTAGE_ESTIMATORS.get(estimator)
    rewards = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    returns = token_returns(rewards, token_penalty, mask)
    return fn(rewards, group_ids, returns, mask)
