"""Surrogate policy losses: the RPG family, PPO/GRPO/DAPO clip (and GSPO's sequence-level
clip), importance-weighted REINFORCE, CISPO.

Legend: B = batch (sequences), T = response tokens. Per token, with grad only through logp:

    w = pi / mu = exp(logp - old_logp)       importance weight to the behaviour policy mu
    q = ref / mu = exp(ref_logp - old_logp)  reference weight (q = 1 when ref = mu)
    rho = w / q = pi / ref

RPG surrogates (paper Table 1, Props. 3.2, 3.6, E.1, E.3; the q factor generalizes them to a
reference that differs from the sampler). grad L = -grad J for J = E_pi[R] - beta * D:

    D = KL(ref||pi)   fkl    L = -w A - beta q log w
    D = UKL(ref||pi)  ufkl   L = -w A + beta (w - q log w)                (k3 form)
    D = KL(pi||ref)   rkl    L =  w (-A + beta log rho)
    D = UKL(pi||ref)  urkl   L = -w A + beta (w log rho - w)
    D = (KL(pi||ref) + KL(ref||pi)) / 2    js    L = -w A + beta (w log rho - q log w) / 2
    D = (UKL(pi||ref) + UKL(ref||pi)) / 2  ujs   the same L: (urkl + ufkl) / 2 = (rkl + fkl) / 2

(fkl uses log w instead of the table's log pi: same gradient, loss value centred at 0.)
The REINFORCE form (paper Table 2 / App. F) is L = -SG(c) * logp with c = -dL/dlogp the
coefficient of grad log pi above, obtained by differentiating the *same* surrogate, so
both forms have identical per-sample gradients (Prop. 4.1) by construction.

Each objective registers here with `@register_objective` (algorithms.objectives), one
signature for its terms and, next to them, the rules a LossConfig must meet to use it;
`compute_policy_loss` picks one, aggregates and returns (loss, metrics). Nothing here calls
.item() or touches files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .clipping import ClipRegions, clip_regions, clipped_pg_term
from .config import AGGREGATIONS, DIVERGENCES, ESTIMATORS, LossConfig
from .correction import CorrectionConfig, correct
from .kl import kl, kl_estimate, ukl
from .objectives import get_objective, invalid, register_objective

# The metrics `compute_policy_loss` returns, in order: the one list of their names.
LOSS_METRICS = ("loss", "pg_loss", "kl_loss", "is_weight_mean", "is_weight_max",
                "clip_frac_upper", "clip_frac_lower", "clip_frac_dual", "kl_ref_k1", "kl_ref_k3",
                "kl_behav_k1", "kl_behav_k3")

# --- the RPG regularizer surrogates, one per divergence ---------------------------------------
# Each takes (logw, logq) [B, T] (grad through logw) and returns the KL part of L without beta.


@dataclass(frozen=True)
class RpgDivergence:
    """One registered divergence (`LossConfig.divergence`, `RPG-<NAME>` methods, the audit).

    surrogate(logw, logq) -> the KL part of L without beta, [B, T]; the REINFORCE form's
        coefficient is its derivative (`stop_gradient_coefficient`).
    exact(pi, ref) -> D(pi, ref) over the last dim of probability tensors (audit, tests).
    label: how the audit table names D.
    """

    surrogate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    exact: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    label: str


def _fkl(logw: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    return -logq.exp() * logw


def _ufkl(logw: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    return logw.exp() - logq.exp() * logw


def _rkl(logw: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    return logw.exp() * (logw - logq)


def _urkl(logw: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    return logw.exp() * (logw - logq - 1.0)


def _js(logw: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    # The released core_algos.py `rpg_js`, 0.5 (w log w - log w) at q = 1: the mean of the
    # rkl and fkl surrogates, so its gradient is that of (KL(pi||ref) + KL(ref||pi)) / 2.
    return 0.5 * (_rkl(logw, logq) + _fkl(logw, logq))


def _ujs(logw: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    # `rpg_ujs`: (urkl + ufkl) / 2, algebraically the same function as _js (the -w of urkl
    # cancels the +w of ufkl); the released code also gives both one expression.
    return 0.5 * (_urkl(logw, logq) + _ufkl(logw, logq))


# A new divergence is one registration here: the config, the sweep axis, the RPG-<NAME> and
# RPG-REINFORCE-<NAME> methods and the audit's rows all read this registry.
DIVERGENCES.register("fkl", RpgDivergence(_fkl, lambda pi, ref: kl(ref, pi), "KL(ref||pi)"))
DIVERGENCES.register("ufkl", RpgDivergence(_ufkl, lambda pi, ref: ukl(ref, pi), "UKL(ref||pi)"))
DIVERGENCES.register("rkl", RpgDivergence(_rkl, lambda pi, ref: kl(pi, ref), "KL(pi||ref)"))
DIVERGENCES.register("urkl", RpgDivergence(_urkl, lambda pi, ref: ukl(pi, ref), "UKL(pi||ref)"))
# js/ujs: the released code's symmetrised KLs
DIVERGENCES.register("js", RpgDivergence(
    _js, lambda pi, ref: 0.5 * (kl(pi, ref) + kl(ref, pi)), "(KL(pi||ref)+KL(ref||pi))/2"))
DIVERGENCES.register("ujs", RpgDivergence(
    _ujs, lambda pi, ref: 0.5 * (ukl(pi, ref) + ukl(ref, pi)), "(UKL(pi||ref)+UKL(ref||pi))/2"))


def stop_gradient_coefficient(
    surrogate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    logw: torch.Tensor,
    logq: torch.Tensor,
) -> torch.Tensor:
    """-d surrogate / d log pi, detached: the weight on grad log pi of a surrogate term.

    Differentiates an elementwise function of a detached copy, so it costs a few
    elementwise kernels and never touches the model's graph.
    """
    with torch.enable_grad():
        x = logw.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(surrogate(x, logq.detach()).sum(), x)
    return -grad


# --- per-token loss terms of each objective ------------------------------------------------------


class Terms(NamedTuple):
    """Per-token loss terms of one objective (all [B, T], or [B, 1] for sequence ratios)."""

    pg: torch.Tensor  # reward (policy-gradient) term
    kl: torch.Tensor  # KL term, beta included
    regions: ClipRegions  # clipped tokens
    weight: torch.Tensor  # importance weight w = pi / mu


def _check_rpg(cfg: LossConfig) -> None:
    """The KL term of an rpg surrogate is exact: a divergence, no estimator, beta > 0."""
    if cfg.divergence is None:
        raise invalid(cfg, "divergence", None,
                      f"rpg needs one of {', '.join(map(repr, DIVERGENCES))}")
    if cfg.kl_placement != "exact":
        raise invalid(cfg, "kl_placement", cfg.kl_placement, "rpg's KL term is exact; use 'exact'")
    if cfg.estimator is not None:
        raise invalid(cfg, "estimator", cfg.estimator,
                      "rpg surrogates use no k1/k2/k3 estimator; leave it null")
    if cfg.kl_importance_weight != "none":
        raise invalid(cfg, "kl_importance_weight", cfg.kl_importance_weight,
                      "the rpg surrogate carries its own weights; leave it 'none'")
    if cfg.beta <= 0:
        raise invalid(cfg, "beta", cfg.beta, "rpg needs beta > 0 (use ppo without KL for beta=0)")
    if cfg.ratio_level == "sequence_normalized":
        raise invalid(cfg, "ratio_level", cfg.ratio_level, "GSPO's normalised ratio is ppo's; "
                      "rpg's exact sequence ratio is 'sequence'")


@register_objective("rpg", check=_check_rpg, default_form="differentiable", exact_kl=True)
def _rpg_terms(cfg, logp, logw, logq, adv) -> Terms:
    w = logw.exp()
    surrogate = DIVERGENCES.get(cfg.divergence).surrogate
    if cfg.form == "differentiable":
        # Algorithm 1: dual-clip the reward term (branch on A), keep the exact KL term.
        regions = clip_regions(w, adv, cfg.clip)
        pg = clipped_pg_term(w, adv, regions, cfg.clip)
        kl = cfg.beta * surrogate(logw, logq)
        return Terms(pg, kl, regions, w)
    # Algorithm 2 (RPG-Style Clip): the exact RPG coefficient c = w A + C_KL inside the trust
    # region; the branch follows the sign of c, i.e. of the effective advantage
    # A' = A + C_KL / w. In a clipped region the gradient stops and the loss keeps the
    # paper's constant value SG(bound * A') * l, with l = -logp (App. G; Figure 3).
    pg_coef = (w * adv).detach()
    kl_coef = cfg.beta * stop_gradient_coefficient(surrogate, logw, logq)
    regions = clip_regions(w, pg_coef + kl_coef, cfg.clip, lower_inclusive=True)
    active = regions.active
    pg_coef, kl_coef = torch.broadcast_tensors(pg_coef, kl_coef)
    if cfg.clip is not None:
        held = regions.bound(cfg.clip, pg_coef) / w.detach()  # bound / w: rescales w A' to bound A'
        pg_coef = torch.where(active, pg_coef, pg_coef * held)
        kl_coef = torch.where(active, kl_coef, kl_coef * held)
    lp = torch.where(active, logp, logp.detach())
    return Terms(-pg_coef * lp, -kl_coef * lp, regions, w)


def _penalty(cfg, logp, logw, logq) -> torch.Tensor:
    """KL penalty in the loss: beta * iw * k(pi vs ref) (GRPO; Sec. 2.2's weighted fix)."""
    if cfg.kl_placement != "loss":
        return torch.zeros_like(logp)
    # k depends on log(ref / pi) = logq - logw only, so (logw, logq) stand in for (logp, ref).
    k = kl_estimate(logw, logq, cfg.estimator)
    if cfg.kl_importance_weight == "detached":
        k = logw.exp().detach() * k
    elif cfg.kl_importance_weight == "differentiable":
        k = logw.exp() * k
    elif cfg.kl_importance_weight == "score":
        # value 1, gradient grad log pi: the score-function term of a KL whose samples are
        # taken as pi's (on-policy it equals "differentiable"; off-policy it is not corrected)
        k = (logw - logw.detach()).exp() * k
    return cfg.beta * k


def _check_penalty(cfg: LossConfig) -> None:
    """Rules of a penalty objective (ppo, reinforce): a KL term, if any, is an estimator
    placed in the loss or the reward with beta > 0; the form is the objective's own."""
    if cfg.divergence is not None:
        raise invalid(cfg, "divergence", cfg.divergence,
                      "only rpg takes a divergence; use estimator + kl_placement instead")
    if cfg.kl_placement == "exact":
        raise invalid(cfg, "kl_placement", "exact", "allowed: 'loss', 'reward', 'none'")
    if cfg.kl_placement == "none":
        if cfg.beta != 0 or cfg.estimator is not None:
            raise invalid(cfg, "kl_placement", "none",
                          "with no KL term set beta=0 and estimator=null, or choose "
                          "kl_placement 'loss' or 'reward'")
    else:
        if cfg.estimator is None:
            raise invalid(cfg, "estimator", None, f"kl_placement={cfg.kl_placement!r} needs "
                          f"one of {', '.join(map(repr, ESTIMATORS))}")
        if cfg.beta <= 0:
            raise invalid(cfg, "beta", cfg.beta, "a KL penalty needs beta > 0")
    if cfg.kl_placement != "loss" and cfg.kl_importance_weight != "none":
        raise invalid(cfg, "kl_importance_weight", cfg.kl_importance_weight,
                      "an importance weight applies only to kl_placement='loss'")
    form = get_objective(cfg.objective).default_form
    if cfg.form != form:
        raise invalid(cfg, "form", cfg.form, f"{cfg.objective} is {form!r} by definition; "
                      "use objective='rpg' to choose a form")
    if cfg.ratio_level == "sequence":
        raise invalid(cfg, "ratio_level", cfg.ratio_level, "exact sequence ratios are for rpg "
                      "only; ppo takes GSPO's 'sequence_normalized'")
    if cfg.ratio_level == "sequence_normalized":
        if cfg.objective != "ppo":
            raise invalid(cfg, "ratio_level", cfg.ratio_level,
                          "GSPO's normalised sequence ratio is for objective 'ppo' only")
        if cfg.kl_placement != "none":
            raise invalid(cfg, "kl_placement", cfg.kl_placement, "GSPO's sequence ratio takes "
                          "one advantage per sequence and no per-token KL; use 'none'")


@register_objective("ppo", check=_check_penalty, default_form="differentiable")
def _ppo_terms(cfg, logp, logw, logq, adv) -> Terms:
    w = logw.exp()
    regions = clip_regions(w, adv, cfg.clip)
    pg = clipped_pg_term(w, adv, regions, cfg.clip)
    return Terms(pg, _penalty(cfg, logp, logw, logq), regions, w)


@register_objective("reinforce", check=_check_penalty, default_form="reinforce")
def _reinforce_terms(cfg, logp, logw, logq, adv) -> Terms:
    w = logw.exp()
    regions = clip_regions(w, adv, cfg.clip)
    keep = regions.active.to(logp.dtype)
    pg = -(w * adv).detach() * logp * keep
    return Terms(pg, _penalty(cfg, logp, logw, logq), regions, w)


def _check_cispo(cfg: LossConfig) -> None:
    """CISPO clips the weight on both sides whatever the advantage's sign: no dual clip."""
    _check_penalty(cfg)
    if cfg.clip is not None and cfg.clip.dual_c is not None:
        raise invalid(cfg, "clip.dual_c", cfg.clip.dual_c, "CISPO's weight is clipped to "
                      "[1 - eps_low, 1 + eps_high] for every token; set clip.dual_c: null")


@register_objective("cispo", check=_check_cispo, default_form="reinforce")
def _cispo_terms(cfg, logp, logw, logq, adv) -> Terms:
    """CISPO (MiniMax-M1, Chen et al. 2025, eq. 4-5): -SG(clip(w, 1-eps_low, 1+eps_high) A)
    log pi. The clip bounds the weight instead of dropping the token: every token keeps a
    gradient; the clip_frac_* metrics count the tokens whose weight was bounded."""
    w = logw.exp()
    if cfg.clip is None:
        weight = w
        none = torch.zeros_like(w, dtype=torch.bool)
        regions = ClipRegions(none, none, none)
    else:
        low, high = 1.0 - cfg.clip.eps_low, 1.0 + cfg.clip.eps_high
        weight = w.clamp(min=low, max=high)
        moved = (adv != 0).expand_as(w)
        regions = ClipRegions((w > high) & moved, (w < low) & moved, torch.zeros_like(moved))
    pg = -(weight * adv).detach() * logp
    return Terms(pg, _penalty(cfg, logp, logw, logq), regions, w)


# --- aggregation ---------------------------------------------------------------------------------


def aggregate(
    values: torch.Tensor, mask: torch.Tensor, agg: str, norm_len: int | None = None
) -> torch.Tensor:
    """Reduce per-token values [B, T] over the mask to a scalar.

    token-mean: sum / #tokens (DAPO); seq-mean-token-mean: mean over sequences of each
    sequence's token mean (GRPO paper); seq-mean-token-sum: mean over sequences of token
    sums; seq-mean-token-sum-norm: token sum / (B * norm_len), a constant divisor (Dr. GRPO).
    """
    reduce = AGGREGATIONS.get(agg)
    mask = mask.to(values.dtype)
    return reduce(values * mask, mask, norm_len)


# name -> f(masked values [B, T], mask [B, T], norm_len) -> scalar
AGGREGATIONS.register("token-mean", lambda masked, mask, _: masked.sum() / mask.sum().clamp_min(1.0))
AGGREGATIONS.register("seq-mean-token-mean",
                      lambda masked, mask, _: (masked.sum(-1) / mask.sum(-1).clamp_min(1.0)).mean())
AGGREGATIONS.register("seq-mean-token-sum", lambda masked, mask, _: masked.sum(-1).mean())
AGGREGATIONS.register("seq-mean-token-sum-norm", lambda masked, mask, norm_len: masked.sum() / (
    masked.shape[0] * (norm_len or masked.shape[-1])))


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp_min(1.0)


def _masked_max(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.bool(), x, torch.full_like(x, float("-inf"))).max()


# --- the entry point ------------------------------------------------------------------------------


def compute_policy_loss(
    cfg: LossConfig,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    norm_len: int | None = None,
    entropy: torch.Tensor | None = None,
    mu_logp: torch.Tensor | None = None,
    correction: CorrectionConfig | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Scalar policy loss and detached metrics for one (mini-)batch.

    logp [B, T]: log pi_theta of the sampled tokens (with grad); old_logp [B, T]: the
    behaviour policy's (no grad); ref_logp [B, T] or None (None: reference = behaviour
    policy, the paper's setting); advantages [B] or [B, T]; mask [B, T] (1 on response
    tokens). norm_len: constant divisor of "seq-mean-token-sum-norm" (max response length).
    entropy [B, T]: per-token entropy of pi (with grad), needed when cfg.entropy_coef > 0.
    mu_logp [B, T]: the sampler's own log-probs (the engine's; None = old_logp) and
    `correction` (None = mode none) correct for mu != pi_old (algorithms.correction): every
    per-token term is multiplied by the mode's stop-gradient weight, and under `sampler`
    every ratio is taken against mu (the reference, when None, stays pi_old).

    Metrics: LOSS_METRICS, as 0-dim tensors (no host sync).
    """
    if logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)} and "
                         f"mask {tuple(mask.shape)} must have the same [B, T] shape")
    old_logp = old_logp.detach()
    ref_logp = None if ref_logp is None else ref_logp.detach()
    adv = advantages.detach()
    if adv.dim() == 1:
        adv = adv[:, None]  # (B, 1) broadcasts over tokens
    maskf = mask.to(logp.dtype)

    weight = None
    if correction is not None and correction.mode != "none":  # none: today's loss, bit for bit
        fix = correct(old_logp, old_logp if mu_logp is None else mu_logp, mask,
                      correction.mode, correction.cap)
        weight = fix.weight.to(logp.dtype)
        if ref_logp is None and correction.mode == "sampler":
            ref_logp = old_logp  # the reference is the trainer's pi_old, not the sampler
        old_logp = fix.behaviour
    logw = logp - old_logp
    logq = torch.zeros_like(old_logp) if ref_logp is None else ref_logp - old_logp

    if cfg.ratio_level == "sequence_normalized":
        # GSPO (Zheng et al. 2025, eq. 7): s = (pi / mu)^(1/|y|), the geometric mean of the
        # token ratios, clipped per sequence; log pi enters as its token mean, so the gradient
        # is s A (1/|y|) sum_t grad log pi_t. Spread evenly over the tokens like "sequence".
        if adv.shape[-1] != 1:
            raise ValueError("ratio_level='sequence_normalized' needs one advantage per "
                             f"sequence, got advantages of shape {tuple(advantages.shape)}")
        length = maskf.sum(-1, keepdim=True).clamp_min(1.0)  # (B, 1)
        terms = get_objective(cfg.objective).terms(
            cfg, (logp * maskf).sum(-1, keepdim=True) / length,
            (logw * maskf).sum(-1, keepdim=True) / length,
            (logq * maskf).sum(-1, keepdim=True) / length, adv,
        )
        per_token = maskf / length  # (B, T)
        pg, kl = terms.pg * per_token, terms.kl * per_token
        weight_mask = maskf.any(-1, keepdim=True)
    elif cfg.ratio_level == "sequence":
        # Product of token ratios: one weight per sequence, exact for every divergence on
        # sequences (higher variance). The sequence loss is spread evenly over its tokens
        # so that `agg` keeps its meaning.
        if adv.shape[-1] != 1:
            raise ValueError("ratio_level='sequence' needs one advantage per sequence, "
                             f"got advantages of shape {tuple(advantages.shape)}")
        seq_logp = (logp * maskf).sum(-1, keepdim=True)  # (B, 1)
        terms = get_objective(cfg.objective).terms(
            cfg, seq_logp, (logw * maskf).sum(-1, keepdim=True),
            (logq * maskf).sum(-1, keepdim=True), adv,
        )
        per_token = maskf / maskf.sum(-1, keepdim=True).clamp_min(1.0)  # (B, T)
        pg, kl = terms.pg * per_token, terms.kl * per_token
        weight_mask = maskf.any(-1, keepdim=True)
    else:
        terms = get_objective(cfg.objective).terms(cfg, logp, logw, logq, adv)
        pg, kl = terms.pg, terms.kl
        weight_mask = mask
    if weight is not None:  # the correction: a stop-gradient factor on every term
        pg, kl = pg * weight, kl * weight

    pg_loss = aggregate(pg, mask, cfg.agg, norm_len)
    kl_loss = aggregate(kl, mask, cfg.agg, norm_len)
    loss = pg_loss + kl_loss
    if cfg.entropy_coef > 0:
        # verl's entropy bonus: policy_loss = pg_loss - entropy_coeff * agg(entropy), same agg.
        # A Python branch on the config, so coef 0 leaves the loss bit-identical.
        if entropy is None or entropy.shape != mask.shape:
            raise ValueError(f"entropy_coef={cfg.entropy_coef} needs the per-token entropy "
                             f"[B, T] = {tuple(mask.shape)}, got "
                             f"{None if entropy is None else tuple(entropy.shape)}")
        loss = loss - cfg.entropy_coef * aggregate(entropy, mask, cfg.agg, norm_len)

    metrics = _metrics(terms, (loss, pg_loss, kl_loss), logp, old_logp, ref_logp, mask,
                       weight_mask)
    return loss, metrics


@torch.no_grad()
def _metrics(terms: Terms, losses, logp, old_logp, ref_logp, mask, weight_mask) -> dict:
    """LOSS_METRICS of one loss evaluation, detached 0-dim tensors (no host sync)."""
    loss, pg_loss, kl_loss = losses
    regions, w = terms.regions, terms.weight
    region_mask = weight_mask.expand_as(regions.upper)
    ref_for_kl = old_logp if ref_logp is None else ref_logp
    metrics = {
        "loss": loss.detach(),
        "pg_loss": pg_loss.detach(),
        "kl_loss": kl_loss.detach(),
        "is_weight_mean": _masked_mean(w.expand_as(region_mask), region_mask),
        "is_weight_max": _masked_max(w.expand_as(region_mask), region_mask),
        "clip_frac_upper": _masked_mean(regions.upper.to(logp.dtype), region_mask),
        "clip_frac_lower": _masked_mean(regions.lower.to(logp.dtype), region_mask),
        "clip_frac_dual": _masked_mean(regions.dual.to(logp.dtype), region_mask),
        "kl_ref_k1": _masked_mean(kl_estimate(logp, ref_for_kl, "k1"), mask),
        "kl_ref_k3": _masked_mean(kl_estimate(logp, ref_for_kl, "k3"), mask),
        "kl_behav_k1": _masked_mean(kl_estimate(logp, old_logp, "k1"), mask),
        "kl_behav_k3": _masked_mean(kl_estimate(logp, old_logp, "k3"), mask),
    }
    return {k: v.detach() for k, v in metrics.items()}
