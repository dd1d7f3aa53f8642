"""Importance-weight clipping regions shared by PPO clip, Algorithm 1 and Algorithm 2.

With w = pi / pi_old on a token and s the *branch score* (the advantage A for PPO and for
Algorithm 1; the token's whole stop-gradient weight w * A' = w * A + C_KL for Algorithm 2,
paper App. G, whose sign is the sign of the effective advantage A' = A + C_KL / w), a
token is *clipped* (its gradient through the clipped term is zero) in exactly one region:

    upper: s > 0 and w >= 1 + eps_high      (PPO's upper bound; DAPO's clip-higher)
    lower: s < 0 and w <  1 - eps_low       (Algorithm 2: w <= 1 - eps_low)
    dual:  s < 0 and w >= c                 (dual clip, Ye et al. 2020)

A token with s = 0 is in no region: its gradient through the clipped term is zero whatever
the clip does, so it is neither clipped nor counted as clipped (the clip-fraction metrics
count only tokens whose gradient the clip changes). Algorithm 1 (differentiable surrogate)
replaces -A*w by the constant -A*bound in a region and keeps the KL term; Algorithm 2
(RPG-Style Clip, REINFORCE surrogate) stops the whole token's gradient there. Outside the
regions the gradient flows unchanged, so inside the trust region both remain the exact RPG
gradient. Algorithm 1's boundaries follow verl's dual-clip PPO; Algorithm 2's follow the
paper's Algorithm 2 (`w <= 1 - eps_low` stops the gradient).
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

    def bound(self, clip: ClipConfig, like: torch.Tensor) -> torch.Tensor:
        """The weight each clipped token is held at (1 + eps_high, 1 - eps_low or c), shaped
        and typed like `like`; 0 inside the trust region."""
        def full(v: float) -> torch.Tensor:
            return torch.full_like(like, v)

        return torch.where(self.upper, full(1.0 + clip.eps_high), torch.where(
            self.lower, full(1.0 - clip.eps_low),
            torch.where(self.dual, full(clip.dual_c or 0.0), full(0.0))))


def clip_regions(
    w: torch.Tensor, score: torch.Tensor, clip: ClipConfig | None, *,
    lower_inclusive: bool = False,
) -> ClipRegions:
    """Which tokens each bound clips. w, score: broadcastable [B, T]; no grad needed.

    score: the quantity whose sign picks the branch (A, or Algorithm 2's w * A').
    lower_inclusive: clip the lower branch at w == 1 - eps_low too (Algorithm 2).
    """
    w, score = torch.broadcast_tensors(w.detach(), score.detach())
    if clip is None:
        none = torch.zeros_like(w, dtype=torch.bool)
        return ClipRegions(none, none, none)
    positive, negative = score > 0, score < 0
    low = 1.0 - clip.eps_low
    upper = positive & (w >= 1.0 + clip.eps_high)
    lower = negative & ((w <= low) if lower_inclusive else (w < low))
    if clip.dual_c is None:
        dual = torch.zeros_like(upper)
    else:
        dual = negative & (w >= clip.dual_c)
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
    return torch.where(regions.active, -adv * w, -adv * regions.bound(clip, w))
