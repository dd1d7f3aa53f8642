"""`LossConfig`: one typed, validated description of a policy loss.

Every named method and every grid cell of a sweep resolves to one `LossConfig`. Invalid
combinations are rejected at construction, by the rules each objective registers next to
its loss (`algorithms.objectives`, `algorithms.losses`), with a message that names the field, the
bad value and what is allowed, so a sweep fails before any job starts.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .objectives import OBJECTIVES, get_objective, invalid
from .registry import Registry

# Filled where each is defined: divergences and aggregations in `algorithms/losses.py`, KL
# estimators in `algorithms/kl.py`; a field below accepts whatever is registered.
DIVERGENCES: Registry = Registry("divergence")
ESTIMATORS: Registry = Registry("estimator")
AGGREGATIONS: Registry = Registry("agg")
Divergence = DIVERGENCES.Name
Estimator = ESTIMATORS.Name
Aggregation = AGGREGATIONS.Name
Form = Literal["differentiable", "reinforce"]
Placement = Literal["exact", "loss", "reward", "none"]
ImportanceWeight = Literal["none", "detached", "differentiable", "score"]
RatioLevel = Literal["token", "sequence", "sequence_normalized"]

PAPER_DUAL_C = 10.0  # the released recipe's clip_ratio_c=10.0 (every script); the paper gives none


class ClipConfig(BaseModel):
    """Importance-weight clipping: PPO-style range [1-eps_low, 1+eps_high] plus dual clip c.

    The defaults are the paper's (Sec. 5: 0.2, 0.28) and the released recipe's c = 10: the one
    owner of these numbers (`PAPER_CLIP`, the sweep's clip axis and run configs read them).

    On the differentiable surrogate this is Algorithm 1 of the paper (dual-clip PPO on the
    reward term); on the REINFORCE surrogate it is Algorithm 2, "RPG-Style Clip".
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    eps_low: float = Field(0.2, ge=0.0, lt=1.0, description="lower clip: w < 1 - eps_low")
    eps_high: float = Field(0.28, ge=0.0, description="upper clip: w > 1 + eps_high")
    dual_c: float | None = Field(PAPER_DUAL_C,
                                 description="dual clip for A < 0: w > c (None = off)")

    @model_validator(mode="after")
    def _check_c(self) -> ClipConfig:
        if self.dual_c is not None and self.dual_c <= 1.0 + self.eps_high:
            raise ValueError(
                f"clip.dual_c={self.dual_c} must exceed 1 + eps_high = {1.0 + self.eps_high} "
                "(dual clip bounds the weight of negative-advantage tokens from above); "
                f"use e.g. {PAPER_DUAL_C} (the paper's), or null to disable"
            )
        return self


class LossConfig(BaseModel):
    """What `compute_policy_loss` computes. Frozen: a config is a value, safe to share.

    objective: "rpg" = the paper's KL-correct surrogates (the KL term is exact, placement
        "exact"); "ppo" = PPO/GRPO/DAPO clip objective with an optional KL penalty;
        "reinforce" = importance-weighted REINFORCE with an optional KL penalty.
    divergence: for rpg, the regularizer: fkl = KL(ref||pi), ufkl = UKL(ref||pi),
        rkl = KL(pi||ref), urkl = UKL(pi||ref); js / ujs = the released code's rpg_js /
        rpg_ujs: (KL(pi||ref) + KL(ref||pi)) / 2 and its unnormalized twin (a symmetrised
        KL, not Jensen-Shannon despite the name). Must be None for penalty objectives.
    form: "differentiable" (paper Table 1) or "reinforce" (stop-gradient, Table 2 / App. F).
        Defaults per objective (rpg/ppo: differentiable, reinforce: reinforce).
    estimator: k1/k2/k3 (Schulman 2020), abs, low_var_kl (verl's clamped k3) or a "+"
        straight-through variant (algorithms/kl.py) for a penalty in the loss or the reward.
    kl_placement: "exact" (rpg only), "loss", "reward" or "none".
    kl_importance_weight: weight on a loss-placed penalty: "none" (GRPO), "detached" or
        "differentiable" (the paper's Sec. 2.2 correction of GRPO), or "score":
        exp(logp - SG(logp)), value 1 with the ratio's gradient at pi (NeMo-RL's default).
    ratio_level: "token" (practical), "sequence" (product of token ratios, the exact
        estimator; rpg only) or "sequence_normalized" (GSPO: the length-normalised, i.e.
        geometric-mean, product of token ratios, clipped per sequence; ppo only).
    clip: None or a ClipConfig.
    beta: KL coefficient; 0 exactly when kl_placement is "none".
    agg: how the [batch, tokens] loss is reduced to a scalar.
    entropy_coef: entropy bonus, L -= entropy_coef * agg(H) with H the per-token entropy of
        pi (verl's `entropy_coeff`, reduced with the same `agg`); 0 = off, the loss untouched.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    objective: OBJECTIVES.Name = "rpg"
    divergence: Divergence | None = None
    form: Form | None = None
    estimator: Estimator | None = None
    kl_placement: Placement | None = None
    kl_importance_weight: ImportanceWeight = "none"
    ratio_level: RatioLevel = "token"
    clip: ClipConfig | None = None
    beta: float = Field(0.0, ge=0.0)
    agg: Aggregation = "token-mean"
    entropy_coef: float = Field(0.0, ge=0.0, description="entropy bonus coefficient (verl's "
                                "entropy_coeff; every released RPG script: 0)")

    @model_validator(mode="before")
    @classmethod
    def _fill_defaults(cls, data):
        """Derived defaults: form and placement follow from the objective."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if data.get("objective", "rpg") not in OBJECTIVES:
            return data  # `_known_objective` names the registered ones
        objective = OBJECTIVES[data.get("objective", "rpg")]
        if data.get("form") is None:
            data["form"] = objective.default_form
        if data.get("kl_placement") is None:
            data["kl_placement"] = objective.default_placement(data.get("estimator"))
        return data

    @model_validator(mode="after")
    def _check_combination(self) -> LossConfig:
        """The objective's own rules (registered next to its loss), then the shared ones."""
        get_objective(self.objective).check(self)
        if self.ratio_level == "sequence" and self.clip is not None:
            raise invalid(self, "clip", self.clip, "sequence-level ratios are the exact, "
                          "unclipped estimator; set clip=null or ratio_level='token'")
        return self
