"""RLOO, GSPO and CISPO by hand: the leave-one-out baseline, GSPO's length-normalised
sequence ratio and its sequence-level clip, CISPO's clipped stop-gradient weight."""

import math

import pytest
import torch

from algorithms import METHODS, LossConfig, compute_advantages, compute_policy_loss

F64 = torch.float64


def test_rloo_is_the_leave_one_out_baseline():
    # group 0: 2 - (0+1+3)/3, 0 - (2+1+3)/3, 1 - (2+0+3)/3, 3 - (2+0+1)/3; group 1: 1 - 4, 4 - 1;
    # a group of one keeps its reward (no other sample to compare with).
    rewards = torch.tensor([2.0, 0.0, 1.0, 3.0, 1.0, 4.0, 5.0], dtype=F64)
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    want = torch.tensor([2 / 3, -2.0, -2 / 3, 2.0, -3.0, 3.0, 5.0], dtype=F64)
    assert torch.allclose(compute_advantages(rewards, groups, "rloo"), want, atol=1e-15)
    assert METHODS["RLOO"].advantage == "rloo"
    assert (METHODS["RLOO"].loss.objective, METHODS["RLOO"].loss.agg) == ("reinforce", "token-mean")


def _grad(cfg, logw, adv, mask=None):
    old = torch.full_like(logw, math.log(0.3))
    logp = (old + logw).requires_grad_(True)
    mask = torch.ones_like(logw) if mask is None else mask
    loss, metrics = compute_policy_loss(cfg, logp, old, None, adv, mask)
    (grad,) = torch.autograd.grad(loss, logp)
    return float(loss.detach()), grad, metrics


def test_cispo_bounds_every_tokens_weight_and_keeps_its_gradient():
    cfg = METHODS["CISPO"].loss
    w = torch.tensor([[1.5, 1.1, 0.5]], dtype=F64)
    for a in (2.0, -2.0):  # unlike PPO, the sign of A does not decide which tokens are bounded
        loss, grad, metrics = _grad(cfg, w.log(), torch.tensor([a], dtype=F64))
        bounded = torch.tensor([[1.28, 1.1, 0.8]], dtype=F64)  # clip(w, 0.8, 1.28)
        assert torch.allclose(grad, -bounded * a / 3, rtol=1e-12)  # token-mean over 3
        assert loss == pytest.approx(-(bounded * a * (w.log() + math.log(0.3))).sum() / 3)
        assert float(metrics["clip_frac_upper"]) == pytest.approx(1 / 3)
        assert float(metrics["clip_frac_lower"]) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="clip.dual_c=10.0 .*objective='cispo'.*dual_c: null"):
        LossConfig(objective="cispo", clip={"eps_low": 0.2, "eps_high": 0.28})


def test_gspo_ratio_is_the_geometric_mean_clipped_per_sequence():
    cfg = METHODS["GSPO"].loss
    assert (cfg.clip.eps_low, cfg.clip.eps_high, cfg.clip.dual_c) == (3e-4, 4e-4, None)
    # Sequence 0: two tokens, s = sqrt(1.0001 * 1.0003) < 1 + 4e-4, inside; sequence 1: one
    # token (the second is padding), s = 1.01 > 1 + 4e-4 with A > 0, clipped (no gradient).
    w = torch.tensor([[1.0001, 1.0003], [1.01, 7.0]], dtype=F64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=F64)
    adv = torch.tensor([1.5, 2.0], dtype=F64)
    loss, grad, metrics = _grad(cfg, w.log(), adv, mask)
    s0 = math.sqrt(1.0001 * 1.0003)
    # the mean over the two sequences of -A s (clipped: -A (1 + eps_high))
    assert loss == pytest.approx((-1.5 * s0 - 2.0 * (1 + 4e-4)) / 2, rel=1e-12)
    # d/d logp_t of -A s / 2 = -A s (1/|y|) / 2 on each token of sequence 0
    want = torch.tensor([[-1.5 * s0 / 4, -1.5 * s0 / 4], [0.0, 0.0]], dtype=F64)
    assert torch.allclose(grad, want, rtol=1e-12, atol=1e-15)
    assert float(metrics["clip_frac_upper"]) == pytest.approx(0.5)
    # A < 0 and s < 1 - eps_low: the lower clip, the loss held at -A (1 - eps_low)
    loss, grad, _ = _grad(cfg, torch.tensor([[0.99, 0.99]], dtype=F64).log(),
                          torch.tensor([-1.0], dtype=F64))
    assert loss == pytest.approx(1 - 3e-4, rel=1e-12) and float(grad.abs().max()) == 0.0


def test_the_unnormalised_sequence_ratio_is_kept_and_rules_name_the_fix():
    # "sequence" is still the product of token ratios (rpg's exact estimator): A w1 w2 ...
    cfg = LossConfig(objective="rpg", divergence="fkl", form="differentiable",
                     ratio_level="sequence", beta=1e-12)
    loss, _, _ = _grad(cfg, torch.tensor([[1.1, 1.2]], dtype=F64).log(),
                       torch.tensor([1.0], dtype=F64))
    assert loss == pytest.approx(-1.1 * 1.2 / 2, rel=1e-9)  # token-mean of the spread loss
    for kw, match in (
        ({"objective": "ppo", "ratio_level": "sequence"}, "ratio_level='sequence'.*'sequence_normalized'"),
        ({"objective": "reinforce", "ratio_level": "sequence_normalized"}, "for objective 'ppo' only"),
        ({"objective": "ppo", "ratio_level": "sequence_normalized", "estimator": "k3",
          "beta": 1e-3}, "kl_placement='loss'.*use 'none'"),
        ({"objective": "rpg", "divergence": "fkl", "beta": 1e-3,
          "ratio_level": "sequence_normalized"}, "rpg's exact sequence ratio is 'sequence'"),
    ):
        with pytest.raises(ValueError, match=match):
            LossConfig(**kw)


def test_audit_places_the_designs_against_the_exact_gradient():
    """On-policy (w = 1, nothing clipped) RLOO's and CISPO's REINFORCE is exact; GSPO's
    token-mean log pi halves a two-token gradient: relative bias exactly 1/2 on the tree, 0 on
    the one-token policy. Off-policy the clips bias all three."""
    from algorithms.audit import CATEGORICAL, TREE, audit_one, design_rows, make_problem

    rows = {r.name: r for r in design_rows()}
    assert set(rows) == {"RLOO (no KL)", "GSPO (no KL)", "CISPO (no KL)",
                         "RLOO, k1 in reward", "CISPO, k1 in reward"}
    on_tree, on_cat = make_problem(TREE, "on_policy"), make_problem(CATEGORICAL, "on_policy")
    for name in ("RLOO (no KL)", "CISPO (no KL)"):
        assert audit_one(on_tree, rows[name].cfg, None).rel_bias < 1e-12
    gspo = rows["GSPO (no KL)"].cfg
    assert audit_one(on_tree, gspo, None).rel_bias == pytest.approx(0.5, abs=1e-12)
    assert audit_one(on_cat, gspo, None).rel_bias < 1e-12
    off = make_problem(TREE, "off_policy")
    for name in ("RLOO (no KL)", "GSPO (no KL)", "CISPO (no KL)"):
        assert audit_one(off, rows[name].cfg, None).rel_bias > 1e-3
