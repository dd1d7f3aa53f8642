"""LossConfig validation and the method registry."""

import pytest

from algorithms import METHODS, ClipConfig, LossConfig, get_method, with_overrides


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"objective": "rpg", "divergence": "fkl", "beta": 1e-4, "kl_placement": "reward"}, "kl_placement"),
        ({"objective": "rpg", "beta": 1e-4}, "divergence"),
        ({"objective": "rpg", "divergence": "urkl", "beta": 1e-4, "estimator": "k3"}, "estimator"),
        ({"objective": "rpg", "divergence": "urkl", "beta": 0.0}, "beta"),
        ({"objective": "ppo", "divergence": "fkl"}, "divergence"),
        ({"objective": "ppo", "kl_placement": "loss", "beta": 1e-3}, "estimator"),
        ({"objective": "ppo", "estimator": "k3", "kl_placement": "loss", "beta": 0.0}, "beta"),
        ({"objective": "ppo", "estimator": "k3", "kl_placement": "reward", "beta": 1e-3,
          "kl_importance_weight": "differentiable"}, "kl_importance_weight"),
        ({"objective": "ppo", "form": "reinforce"}, "form"),
        ({"objective": "ppo", "ratio_level": "sequence"}, "ratio_level"),
        ({"objective": "rpg", "divergence": "fkl", "beta": 1e-4, "ratio_level": "sequence",
          "clip": {"eps_low": 0.2, "eps_high": 0.2}}, "clip"),
    ],
)
def test_invalid_combinations_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        LossConfig(**kwargs)


def test_unknown_field_and_bad_literal_are_rejected():
    with pytest.raises(ValueError, match="bogus"):
        LossConfig(objective="ppo", bogus=1)
    with pytest.raises(ValueError, match="divergence"):
        LossConfig(objective="rpg", divergence="hellinger", beta=1e-4)


def test_dual_clip_must_exceed_upper_bound():
    with pytest.raises(ValueError, match="dual_c"):
        ClipConfig(eps_low=0.2, eps_high=0.28, dual_c=1.1)


def test_defaults_follow_objective():
    assert LossConfig(objective="rpg", divergence="fkl", beta=0.1).kl_placement == "exact"
    assert LossConfig(objective="ppo").kl_placement == "none"
    assert LossConfig(objective="ppo", estimator="k3", beta=0.1).kl_placement == "loss"
    assert LossConfig(objective="reinforce").form == "reinforce"


def test_registry_has_the_papers_methods_with_paper_hyperparameters():
    expected = {"GRPO", "GRPO-ISKL", "DAPO", "REINFORCE++", "REINFORCE++-Baseline", "Dr.GRPO",
                "RPG-FKL", "RPG-RKL", "RPG-UFKL", "RPG-URKL", "RPG-REINFORCE-FKL",
                "RPG-REINFORCE-RKL", "RPG-REINFORCE-UFKL", "RPG-REINFORCE-URKL",
                "RLOO", "GSPO", "CISPO",  # designs beside the paper's (issue 22)
                "RPG-JS", "RPG-UJS", "RPG-REINFORCE-JS", "RPG-REINFORCE-UJS"}  # released code
    assert set(METHODS) == expected
    urkl = METHODS["RPG-REINFORCE-URKL"]
    assert (urkl.loss.objective, urkl.loss.divergence, urkl.loss.form) == ("rpg", "urkl", "reinforce")
    assert (urkl.loss.clip.eps_low, urkl.loss.clip.eps_high, urkl.loss.clip.dual_c) == (0.2, 0.28, 10.0)
    assert urkl.loss.beta == 1e-4 and urkl.loss.agg == "token-mean" and urkl.reference == "rollout"
    assert METHODS["GRPO"].loss.kl_importance_weight == "none"
    assert METHODS["GRPO-ISKL"].loss.kl_importance_weight == "differentiable"
    assert METHODS["DAPO"].dynamic_sampling and METHODS["DAPO"].loss.beta == 0.0


def test_registry_follows_the_released_recipe_where_the_paper_is_silent():
    """recipe/rpg/7b/*.sh: c = 10 for every method the scripts run (GSPO and CISPO, from
    their own papers, have no dual clip); GRPO clips at (0.2, 0.2) without dynamic
    sampling; DAPO, RPG and REINFORCE++ filter groups on accuracy and shape overlong
    responses; REINFORCE++ puts k1 in the loss against the iterative (rollout) reference."""
    for method in METHODS.values():
        want = None if method.name in ("GSPO", "CISPO") else 10.0
        assert method.loss.clip.dual_c == want, method.name
    grpo = METHODS["GRPO"]
    assert (grpo.loss.clip.eps_low, grpo.loss.clip.eps_high) == (0.2, 0.2)
    assert not grpo.dynamic_sampling and not grpo.overlong_shaping and grpo.reference == "fixed"
    for name in METHODS:
        if name.startswith(("RPG-", "DAPO", "REINFORCE++")):
            assert METHODS[name].dynamic_sampling and METHODS[name].overlong_shaping, name
    for name in ("REINFORCE++", "REINFORCE++-Baseline"):
        loss = METHODS[name].loss
        assert (loss.estimator, loss.kl_placement, loss.kl_importance_weight) == ("k1", "loss", "none")
        assert METHODS[name].reference == "rollout"


def test_get_method_lists_registered_names():
    with pytest.raises(ValueError, match="RPG-URKL"):
        get_method("RPG-XYZ")


def test_with_overrides_revalidates():
    m = with_overrides(get_method("RPG-URKL"), loss={"beta": 1e-3})
    assert m.loss.beta == 1e-3 and m.loss.divergence == "urkl"
    with pytest.raises(ValueError, match="estimator"):
        with_overrides(get_method("RPG-URKL"), loss={"estimator": "k2"})


def test_one_dual_clip_default_the_papers():
    """ClipConfig owns c: the method registry and a sweep's clip axis that leaves dual_c unset
    both get the released recipe's c = 10 (an axis once defaulted to verl's 3)."""
    from algorithms.methods import PAPER_CLIP
    from sweep.spec import ClipAxis

    assert ClipConfig().dual_c == 10.0
    assert PAPER_CLIP == ClipConfig(eps_low=0.2, eps_high=0.28, dual_c=10.0)
    assert ClipAxis(eps_low=0.1, eps_high=0.1).dual_c == 10.0
