"""Importance-weight clipping regions shared by PPO clip, Algorithm 1 and Algorithm 2.

With w = pi / pi_old on a token and A its advantage, a token is *clipped* (its gradient
through the clipped term is zero) in exactly one of three regions:

    upper: A > 0  and w >= 1 + eps_high   (PPO's upper bound; DAPO's clip-higher)
    lower: A <= 0 and w <  1 - eps_low    (PPO's lower bound)
    dual:  A <= 0 and w >= c              (dual clip, Ye et al. 2020)

Algorithm 1 (differentiable surrogate) replaces -A*w by the constant -A*bound there and
keeps the KL term; Algorithm 2 (RPG-Style Clip, REINFORCE surrogate) drops the whole token's
stop-gradient weight there. Outside the regions the gradient flows unchanged, so inside the
trust region both remain the exact RPG gradient. The boundaries (>= / <) follow the paper's
released implementation; A = 0 takes the non-positive branch there too.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .config import ClipConfig


class ClipRegions(NamedTuple):
    """Boolean masks [B, T] (or [B, 1] for sequence ratios) of clipped tokens."""

    upper: torch.Tensor
    lower: torch.Tensor
    dual: torch.Tensor

    @property
    def active(self) -> torch.Tensor:
        """Tokens whose gradient flows (inside the trust region)."""
        return ~(self.upper | self.lower | self.dual)


def clip_regions(w: torch.Tensor, adv: torch.Tensor, clip: ClipConfig | None) -> ClipRegions:
    """Which tokens each bound clips. w, adv: broadcastable [B, T]; no grad needed."""
    w, adv = torch.broadcast_tensors(w.detach(), adv.detach())
    if clip is None:
        none = torch.zeros_like(w, dtype=torch.bool)
        return ClipRegions(none, none, none)
    positive = adv > 0
    upper = positive & (w >= 1.0 + clip.eps_high)
    lower = ~positive & (w < 1.0 - clip.eps_low)
    if clip.dual_c is None:
        dual = torch.zeros_like(upper)
    else:
        dual = ~positive & (w >= clip.dual_c)
    return ClipRegions(upper, lower, dual)


def clipped_pg_term(
    w: torch.Tensor, adv: torch.Tensor, regions: ClipRegions, clip: ClipConfig | None
) -> torch.Tensor:
    """PPO dual-clip reward term (Algorithm 1): -A*w inside, constant -A*bound outside.

    Equal in value to max(-A w, -A clip(w)) with min(., -A c) for A < 0; written with the
    explicit regions so its gradient is zero exactly where `clip_regions` says.
    """
    if clip is None:
        return -adv * w
    bound = torch.where(
        regions.upper,
        torch.full_like(w, 1.0 + clip.eps_high),
        torch.where(regions.lower, torch.full_like(w, 1.0 - clip.eps_low),
                    torch.full_like(w, clip.dual_c or 0.0)),
    )
    return torch.where(regions.active, -adv * w, -adv * bound)
