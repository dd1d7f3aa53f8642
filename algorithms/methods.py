"""Named methods of the RPG study: each a `LossConfig` plus the pieces around the loss.

Hyperparameters follow the paper's experimental setup (Sec. 5 and the released verl
scripts): clip range (eps_low, eps_high) = (0.2, 0.28) for every clipped method, dual-clip
c = 3.0 (the scripts' `clip_ratio_c`), KL coefficient beta = 1e-4, token-mean aggregation,
reference = the rollout policy for RPG (the iterative reference update of Sec. 4; no
reference model is held) and the initial policy for the GRPO-family baselines.
Ablations change fields with `LossConfig.model_copy(update=...)`; see `with_overrides`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, field_validator

from .advantages import ADVANTAGE_ESTIMATORS
from .config import ClipConfig, LossConfig

REFERENCE_SCHEDULES = ("rollout", "fixed", "every_k", "kl_target")

PAPER_CLIP = ClipConfig(eps_low=0.2, eps_high=0.28, dual_c=3.0)  # Sec. 5; scripts' c = 3
PAPER_BETA = 1e-4  # Sec. 5: KL coefficient for every KL-regularized run


class Method(BaseModel):
    """A named method: the loss and what the trainer does around it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    loss: LossConfig
    advantage: str  # key of algorithms.advantages.ADVANTAGE_ESTIMATORS
    reference: str = "rollout"  # default reference schedule (trainer.reference)
    dynamic_sampling: bool = False  # DAPO: drop groups whose rewards are all equal
    overlong_shaping: bool = False  # DAPO: soft length penalty before max length
    source: str = ""  # where the settings come from

    @field_validator("advantage")
    @classmethod
    def _known_advantage(cls, v: str) -> str:
        if v not in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage={v!r} is not registered; choose one of "
                             f"{sorted(ADVANTAGE_ESTIMATORS)}")
        return v

    @field_validator("reference")
    @classmethod
    def _known_reference(cls, v: str) -> str:
        if v not in REFERENCE_SCHEDULES:
            raise ValueError(f"reference={v!r} is not a schedule; choose one of {REFERENCE_SCHEDULES}")
        return v


def _rpg(div: str, form: str) -> LossConfig:
    return LossConfig(objective="rpg", divergence=div, form=form, clip=PAPER_CLIP,
                      beta=PAPER_BETA, agg="token-mean")


def _ppo(**kl) -> LossConfig:
    return LossConfig(objective="ppo", clip=PAPER_CLIP, agg="token-mean", **kl)


_GRPO_KL = {"estimator": "k3", "kl_placement": "loss", "beta": PAPER_BETA}

_METHODS = [
    Method(name="GRPO", loss=_ppo(**_GRPO_KL), advantage="group_zscore", reference="fixed",
           source="Shao et al. 2024; paper Table 3 baseline (k3 in loss, no importance weight)"),
    Method(name="GRPO-ISKL",
           loss=_ppo(**_GRPO_KL, kl_importance_weight="differentiable"),
           advantage="group_zscore", reference="fixed",
           source="paper Sec. 2.2: GRPO's k3 term weighted by pi/pi_old (exact reverse KL)"),
    Method(name="DAPO", loss=_ppo(), advantage="group_zscore", reference="rollout",
           dynamic_sampling=True, overlong_shaping=True,
           source="Yu et al. 2025; paper Table 3 baseline (clip-higher 0.2/0.28, no KL)"),
    Method(name="REINFORCE++",
           loss=_ppo(estimator="k1", kl_placement="reward", beta=PAPER_BETA),
           advantage="reinforce_pp", reference="fixed",
           source="Hu 2025 (k1 KL in the reward, batch-whitened returns); paper Table 5"),
    Method(name="REINFORCE++-Baseline", loss=_ppo(**_GRPO_KL),
           advantage="reinforce_pp_baseline", reference="fixed",
           source="Hu 2025 (group-mean baseline, k3 KL in the loss); paper Table 5"),
    Method(name="Dr.GRPO",
           loss=LossConfig(objective="ppo", clip=PAPER_CLIP, agg="seq-mean-token-sum-norm"),
           advantage="dr_grpo", reference="rollout",
           source="Liu et al. 2025 (no std division, constant length normaliser, no KL)"),
]
for _div in ("fkl", "rkl", "ufkl", "urkl"):
    _METHODS.append(Method(
        name=f"RPG-{_div.upper()}", loss=_rpg(_div, "differentiable"), advantage="group_mean",
        source="paper Table 1 surrogate + Algorithm 1 dual clip; Table 3",
    ))
for _div in ("fkl", "rkl", "ufkl", "urkl"):
    _METHODS.append(Method(
        name=f"RPG-REINFORCE-{_div.upper()}", loss=_rpg(_div, "reinforce"),
        advantage="group_mean",
        source="paper Table 2 REINFORCE surrogate + Algorithm 2 RPG-Style Clip; Table 3",
    ))

METHODS: dict[str, Method] = {m.name: m for m in _METHODS}


def get_method(name: str) -> Method:
    """The registered method `name`; a failed lookup lists what is registered."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"method {name!r} is not registered; choose one of {list(METHODS)}") from None


def with_overrides(method: Method, loss: dict | None = None, **fields) -> Method:
    """A copy of `method` with LossConfig fields and method fields replaced, re-validated."""
    new_loss = method.loss
    if loss:
        new_loss = LossConfig.model_validate({**method.loss.model_dump(), **loss})
    return Method.model_validate({**method.model_dump(), "loss": new_loss, **fields})
