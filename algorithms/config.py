"""`LossConfig`: one typed, validated description of a policy loss.

Every named method and every grid cell of a sweep resolves to one `LossConfig`. Invalid
combinations are rejected here, at construction, with a message that names the field, the
bad value and what is allowed, so a sweep fails before any job starts.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Objective = Literal["rpg", "ppo", "reinforce"]
Divergence = Literal["fkl", "rkl", "ufkl", "urkl"]
Form = Literal["differentiable", "reinforce"]
Estimator = Literal["k1", "k2", "k3"]
Placement = Literal["exact", "loss", "reward", "none"]
ImportanceWeight = Literal["none", "detached", "differentiable"]
RatioLevel = Literal["token", "sequence"]
Aggregation = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]

DEFAULT_FORM: dict[str, str] = {"rpg": "differentiable", "ppo": "differentiable", "reinforce": "reinforce"}


class ClipConfig(BaseModel):
    """Importance-weight clipping: PPO-style range [1-eps_low, 1+eps_high] plus dual clip c.

    On the differentiable surrogate this is Algorithm 1 of the paper (dual-clip PPO on the
    reward term); on the REINFORCE surrogate it is Algorithm 2, "RPG-Style Clip".
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    eps_low: float = Field(0.2, ge=0.0, lt=1.0, description="lower clip: w < 1 - eps_low")
    eps_high: float = Field(0.28, ge=0.0, description="upper clip: w > 1 + eps_high")
    dual_c: float | None = Field(3.0, description="dual clip for A < 0: w > c (None = off)")

    @model_validator(mode="after")
    def _check_c(self) -> ClipConfig:
        if self.dual_c is not None and self.dual_c <= 1.0 + self.eps_high:
            raise ValueError(
                f"clip.dual_c={self.dual_c} must exceed 1 + eps_high = {1.0 + self.eps_high} "
                "(dual clip bounds the weight of negative-advantage tokens from above); "
                "use e.g. 3.0, or null to disable"
            )
        return self


class LossConfig(BaseModel):
    """What `compute_policy_loss` computes. Frozen: a config is a value, safe to share.

    objective: "rpg" = the paper's KL-correct surrogates (the KL term is exact, placement
        "exact"); "ppo" = PPO/GRPO/DAPO clip objective with an optional KL penalty;
        "reinforce" = importance-weighted REINFORCE with an optional KL penalty.
    divergence: for rpg, the regularizer: fkl = KL(ref||pi), ufkl = UKL(ref||pi),
        rkl = KL(pi||ref), urkl = UKL(pi||ref). Must be None for penalty objectives.
    form: "differentiable" (paper Table 1) or "reinforce" (stop-gradient, Table 2 / App. F).
        Defaults per objective (rpg/ppo: differentiable, reinforce: reinforce).
    estimator: k1/k2/k3 (Schulman 2020) for a penalty placed in the loss or the reward.
    kl_placement: "exact" (rpg only), "loss", "reward" or "none".
    kl_importance_weight: weight on a loss-placed penalty: "none" (GRPO), "detached" or
        "differentiable" (the paper's Sec. 2.2 correction of GRPO).
    ratio_level: "token" (practical) or "sequence" (product of token ratios; rpg only).
    clip: None or a ClipConfig.
    beta: KL coefficient; 0 exactly when kl_placement is "none".
    agg: how the [batch, tokens] loss is reduced to a scalar.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    objective: Objective = "rpg"
    divergence: Divergence | None = None
    form: Form | None = None
    estimator: Estimator | None = None
    kl_placement: Placement | None = None
    kl_importance_weight: ImportanceWeight = "none"
    ratio_level: RatioLevel = "token"
    clip: ClipConfig | None = None
    beta: float = Field(0.0, ge=0.0)
    agg: Aggregation = "token-mean"

    @model_validator(mode="before")
    @classmethod
    def _fill_defaults(cls, data):
        """Derived defaults: form and placement follow from the objective."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        objective = data.get("objective", "rpg")
        if data.get("form") is None and objective in DEFAULT_FORM:
            data["form"] = DEFAULT_FORM[objective]
        if data.get("kl_placement") is None:
            if objective == "rpg":
                data["kl_placement"] = "exact"
            else:
                data["kl_placement"] = "loss" if data.get("estimator") else "none"
        return data

    @model_validator(mode="after")
    def _check_combination(self) -> LossConfig:
        def bad(field: str, value, allowed: str) -> ValueError:
            return ValueError(
                f"LossConfig.{field}={value!r} is invalid with objective={self.objective!r}: "
                f"{allowed}"
            )

        if self.objective == "rpg":
            if self.divergence is None:
                raise bad("divergence", None, "rpg needs one of 'fkl', 'rkl', 'ufkl', 'urkl'")
            if self.kl_placement != "exact":
                raise bad("kl_placement", self.kl_placement, "rpg's KL term is exact; use 'exact'")
            if self.estimator is not None:
                raise bad("estimator", self.estimator,
                          "rpg surrogates use no k1/k2/k3 estimator; leave it null")
            if self.kl_importance_weight != "none":
                raise bad("kl_importance_weight", self.kl_importance_weight,
                          "the rpg surrogate carries its own weights; leave it 'none'")
            if self.beta <= 0:
                raise bad("beta", self.beta, "rpg needs beta > 0 (use ppo without KL for beta=0)")
        else:
            if self.divergence is not None:
                raise bad("divergence", self.divergence,
                          "only rpg takes a divergence; use estimator + kl_placement instead")
            if self.kl_placement == "exact":
                raise bad("kl_placement", "exact", "allowed: 'loss', 'reward', 'none'")
            if self.kl_placement == "none":
                if self.beta != 0 or self.estimator is not None:
                    raise bad("kl_placement", "none",
                              "with no KL term set beta=0 and estimator=null, or choose "
                              "kl_placement 'loss' or 'reward'")
            else:
                if self.estimator is None:
                    raise bad("estimator", None, f"kl_placement={self.kl_placement!r} needs "
                              "one of 'k1', 'k2', 'k3'")
                if self.beta <= 0:
                    raise bad("beta", self.beta, "a KL penalty needs beta > 0")
            if self.kl_placement != "loss" and self.kl_importance_weight != "none":
                raise bad("kl_importance_weight", self.kl_importance_weight,
                          "an importance weight applies only to kl_placement='loss'")
            if self.form != DEFAULT_FORM[self.objective]:
                raise bad("form", self.form, f"{self.objective} is "
                          f"{DEFAULT_FORM[self.objective]!r} by definition; "
                          "use objective='rpg' to choose a form")
            if self.ratio_level != "token":
                raise bad("ratio_level", self.ratio_level, "sequence ratios are for rpg only")
        if self.ratio_level == "sequence" and self.clip is not None:
            raise bad("clip", self.clip, "sequence-level ratios are the exact, unclipped "
                      "estimator; set clip=null or ratio_level='token'")
        return self
