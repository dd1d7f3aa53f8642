"""Named methods of the RPG study: each a `LossConfig` plus the pieces around the loss.

Hyperparameters follow the paper where it is explicit and the authors' released verl recipe
(`recipe/rpg/7b/*.sh`) where it is silent; docs/paper-settings.md records each one's
provenance. Clip range (eps_low, eps_high) = (0.2, 0.28) and dual clip c = 10 (every
script's `clip_ratio_c=10.0`); GRPO's script clips at (0.2, 0.2). KL coefficient
beta = 1e-4, token-mean aggregation. Reference = the rollout policy (the iterative
reference update of Sec. 4, `use_iterative_ref_model=True`: no reference model is held) for
RPG and REINFORCE++, the initial policy for GRPO. Dynamic sampling on accuracy and the
overlong penalty are on for every method whose script enables them (DAPO, RPG,
REINFORCE++), off for GRPO. Ablations change fields with `with_overrides`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from . import losses  # noqa: F401 - registers the objectives the LossConfigs below use
from .advantages import ADVANTAGE_ESTIMATORS
from .config import DIVERGENCES, ClipConfig, LossConfig
from .reference import REFERENCE_SCHEDULES
from .registry import Registry

PAPER_CLIP = ClipConfig()  # Sec. 5 (0.2, 0.28); scripts' c = 10: ClipConfig's defaults
GRPO_CLIP = ClipConfig(eps_low=0.2, eps_high=0.2)  # run_grpo_7b.sh (App. H: 0.1)
PAPER_BETA = 1e-4  # Sec. 5: KL coefficient for every KL-regularized run
# GSPO (Zheng et al. 2025): left and right clip 3e-4 and 4e-4 on the normalised
# sequence ratio; no dual clip (verl's compute_policy_loss_gspo has none).
GSPO_CLIP = ClipConfig(eps_low=3e-4, eps_high=4e-4, dual_c=None)
# CISPO bounds the weight of every token: the RPG paper's range (MiniMax-M1 sets no lower
# bound; ClipConfig needs eps_low < 1), no dual clip.
CISPO_CLIP = ClipConfig(dual_c=None)


class Method(BaseModel):
    """A named method: the loss and what the trainer does around it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    loss: LossConfig
    advantage: ADVANTAGE_ESTIMATORS.Name  # algorithms.advantages
    reference: REFERENCE_SCHEDULES.Name = "rollout"  # default reference schedule (algorithms.reference)
    dynamic_sampling: bool = False  # DAPO: drop groups that are all correct or all wrong
    overlong_shaping: bool = False  # DAPO: soft length penalty before max length
    source: str = ""  # where the settings come from



def _rpg(div: str, form: str) -> LossConfig:
    return LossConfig(objective="rpg", divergence=div, form=form, clip=PAPER_CLIP,
                      beta=PAPER_BETA, agg="token-mean")


def _ppo(clip: ClipConfig = PAPER_CLIP, **kl) -> LossConfig:
    return LossConfig(objective="ppo", clip=clip, agg="token-mean", **kl)


_GRPO_KL = {"estimator": "k3", "kl_placement": "loss", "beta": PAPER_BETA}
_DAPO_SAMPLING = {"dynamic_sampling": True, "overlong_shaping": True}

_METHODS = [
    Method(name="GRPO", loss=_ppo(GRPO_CLIP, **_GRPO_KL), advantage="group_zscore",
           reference="fixed",
           source="Shao et al. 2024; paper Table 3 baseline (k3 in loss, no importance "
                  "weight); clip (0.2, 0.2), no dynamic sampling: run_grpo_7b.sh"),
    Method(name="GRPO-ISKL",
           loss=_ppo(GRPO_CLIP, **_GRPO_KL, kl_importance_weight="differentiable"),
           advantage="group_zscore", reference="fixed",
           source="paper Sec. 2.2: GRPO's k3 term weighted by pi/pi_old (exact reverse KL)"),
    Method(name="DAPO", loss=_ppo(), advantage="group_zscore", reference="rollout",
           **_DAPO_SAMPLING,
           source="Yu et al. 2025; paper Table 3 baseline (clip-higher 0.2/0.28, no KL)"),
    Method(name="REINFORCE++",
           loss=_ppo(estimator="k1", kl_placement="loss", beta=PAPER_BETA),
           advantage="reinforce_pp", reference="rollout", **_DAPO_SAMPLING,
           source="Hu 2025, as run_rfpp_7b_1e-4.sh runs it: k1 ('kl') in the loss against "
                  "the iterative reference, returns whitened over tokens; paper Table 5"),
    Method(name="REINFORCE++-Baseline",
           loss=_ppo(estimator="k1", kl_placement="loss", beta=PAPER_BETA),
           advantage="reinforce_pp_baseline", reference="rollout", **_DAPO_SAMPLING,
           source="Hu 2025, as run_rfppb_7b_1e-4.sh runs it: group-mean baseline, whitened "
                  "over tokens, k1 in the loss; paper Table 5"),
    Method(name="Dr.GRPO",
           loss=LossConfig(objective="ppo", clip=PAPER_CLIP, agg="seq-mean-token-sum-norm"),
           advantage="dr_grpo", reference="rollout",
           source="Liu et al. 2025 (no std division, constant length normaliser, no KL)"),
]
_METHODS += [
    Method(name="RLOO",
           loss=LossConfig(objective="reinforce", clip=PAPER_CLIP, agg="token-mean"),
           advantage="rloo", reference="rollout",
           source="Ahmadian et al. 2024 (leave-one-out baseline, REINFORCE, no KL); released "
                  "RPG code's compute_rloo_outcome_advantage; token-mean and the paper's clip "
                  "as every other row here"),
    Method(name="GSPO",
           loss=LossConfig(objective="ppo", ratio_level="sequence_normalized", clip=GSPO_CLIP,
                           agg="seq-mean-token-sum"),
           advantage="group_zscore", reference="rollout",
           source="Zheng et al. 2025: length-normalised sequence ratio, sequence-level clip "
                  "(3e-4, 4e-4), group-normalised advantage, no KL; the mean over sequences is "
                  "its 1/G sum"),
    Method(name="CISPO", loss=LossConfig(objective="cispo", clip=CISPO_CLIP, agg="token-mean"),
           advantage="group_zscore", reference="rollout",
           source="MiniMax-M1 (Chen et al. 2025) eq. 4-5: REINFORCE with a clipped, "
                  "stop-gradient weight, token-mean, group-normalised advantage, no KL; the "
                  "RPG paper's (0.2, 0.28) range (departure: MiniMax-M1 sets no lower bound)"),
]
for _div in DIVERGENCES:  # every registered divergence, in both forms
    _METHODS.append(Method(
        name=f"RPG-{_div.upper()}", loss=_rpg(_div, "differentiable"), advantage="group_mean",
        **_DAPO_SAMPLING,
        source="paper Table 1 surrogate + Algorithm 1 dual clip; Table 3; DAPO sampling (Sec. 5)",
    ))
for _div in DIVERGENCES:
    _METHODS.append(Method(
        name=f"RPG-REINFORCE-{_div.upper()}", loss=_rpg(_div, "reinforce"),
        advantage="group_mean", **_DAPO_SAMPLING,
        source="paper Table 2 REINFORCE surrogate + Algorithm 2 RPG-Style Clip; Table 3; "
               "DAPO sampling (Sec. 5)",
    ))

METHODS: Registry[Method] = Registry("method")
for _method in _METHODS:
    METHODS.register(_method.name, _method)

get_method = METHODS.get  # the registered method `name`; a miss lists the names


def with_overrides(method: Method, loss: dict | None = None, **fields) -> Method:
    """A copy of `method` with LossConfig fields and method fields replaced, re-validated."""
    new_loss = method.loss
    if loss:
        new_loss = LossConfig.model_validate({**method.loss.model_dump(), **loss})
    return Method.model_validate({**method.model_dump(), "loss": new_loss, **fields})
