"""The registries users extend: a loss objective and a reference schedule are each one
decorated definition, picked up by LossConfig validation, compute_policy_loss, methods and
the run/sweep configs without touching any list elsewhere."""

from __future__ import annotations

import pytest
import torch

from algorithms import LossConfig, compute_policy_loss
from algorithms.clipping import clip_regions
from algorithms.losses import Terms
from algorithms.objectives import OBJECTIVES, invalid, register_objective
from algorithms.reference import REFERENCE_SCHEDULES, ReferenceSchedule, register_reference_schedule


@pytest.fixture
def plain_pg():
    """A toy objective: L = -w * A per token, no KL; its rule forbids beta > 0."""

    def check(cfg):
        if cfg.beta != 0:
            raise invalid(cfg, "beta", cfg.beta, "plain_pg has no KL term; set beta=0")

    @register_objective("plain_pg", check=check, default_form="differentiable")
    def terms(cfg, logp, logw, logq, adv):
        w = logw.exp()
        return Terms(-w * adv, torch.zeros_like(logp), clip_regions(w, adv, None), w)

    yield
    del OBJECTIVES["plain_pg"]


def test_a_registered_objective_validates_and_computes(plain_pg):
    cfg = LossConfig(objective="plain_pg")
    assert cfg.form == "differentiable" and cfg.kl_placement == "none"
    logp = torch.zeros(2, 3, requires_grad=True)
    adv = torch.tensor([1.0, -1.0])
    loss, metrics = compute_policy_loss(cfg, logp, torch.zeros(2, 3), None, adv,
                                        torch.ones(2, 3))
    loss.backward()
    # token-mean of -w A with w = 1: d/dlogp = -A / 6 per token
    assert torch.allclose(logp.grad, torch.tensor([[-1.0] * 3, [1.0] * 3]) / 6)
    with pytest.raises(ValueError, match=r"LossConfig.beta=0.5 is invalid with "
                       r"objective='plain_pg': plain_pg has no KL term"):
        LossConfig(objective="plain_pg", beta=0.5)


def test_an_unknown_objective_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"objective='nope' is not registered; choose one of "
                       r"\['rpg', 'ppo', 'reinforce', 'cispo'\]"):
        LossConfig(objective="nope")


def test_the_rules_sit_with_their_objective():
    with pytest.raises(ValueError, match="rpg needs one of 'fkl'"):
        LossConfig(objective="rpg", beta=0.1)
    with pytest.raises(ValueError, match="only rpg takes a divergence"):
        LossConfig(objective="ppo", divergence="fkl")
    with pytest.raises(ValueError, match="sequence-level ratios are the exact"):
        LossConfig(objective="rpg", divergence="fkl", beta=0.1, ratio_level="sequence",
                   clip={"eps_low": 0.2, "eps_high": 0.2})


@pytest.fixture
def every_other():
    """A toy schedule: refresh at every second rollout boundary."""

    @register_reference_schedule("every_other")
    class EveryOther(ReferenceSchedule):
        def __init__(self, **_):
            self.boundaries = 0

        def refresh_due(self, kl_to_ref):
            self.boundaries += 1
            return self.boundaries % 2 == 0

    yield EveryOther
    del REFERENCE_SCHEDULES["every_other"]


def test_a_registered_schedule_is_accepted_everywhere(every_other):
    from algorithms import get_method, with_overrides
    from sweep.spec import ReferenceAxis
    from trainer.config import ReferenceConfig
    from trainer.reference import Reference

    assert with_overrides(get_method("GRPO"), reference="every_other").reference == "every_other"
    assert ReferenceConfig(schedule="every_other").schedule == "every_other"
    assert ReferenceAxis(schedule="every_other").schedule == "every_other"
    policy = torch.nn.Linear(2, 2)
    ref = Reference("every_other", policy)
    with torch.no_grad():
        policy.weight.add_(1.0)
    ref.after_step(policy, None)
    assert ref.updates == 0
    ref.after_step(policy, None)
    assert ref.updates == 1 and torch.equal(ref.model.weight, policy.weight)


def test_an_unknown_schedule_lists_the_registered_ones():
    from trainer.config import ReferenceConfig

    with pytest.raises(ValueError, match=r"choose one of \['rollout', 'fixed', 'every_k', "
                       r"'kl_target'\]"):
        ReferenceConfig(schedule="sometimes")
