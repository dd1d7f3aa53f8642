"""The KL certificate (algorithms/certify.py): its targets against their closed forms, every
fact of issue 53 pinned exactly, the new estimators by hand, and the command line.

Expected verdicts come from the identities below, not from the code's output. With
l = log(pi/ref), r = ref/pi, w = pi/pi_old and sum_y pi grad log pi = 0:
  E_pi[grad k1] = E_pi[grad log pi] = 0                            (k1 in loss: zero)
  E_pi[grad k2] = E_pi[l grad log pi] = grad KL(pi||ref)            (k2: reverse)
  E_pi[grad k3] = sum (pi - ref) grad log pi = grad KL(ref||pi)     (k3: forward)
  E_old[grad (w k)] = grad E_pi[k] = grad KL(pi||ref) for k1, k3   (ratio: reverse)
  E_old[SG(w) grad k] = E_pi[grad k]                                (detached: as on-policy)
  E_pi[l grad log pi] for k1 in the reward, summed to go           (REINFORCE: reverse)
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from algorithms.certify import (
    REGIMES,
    TOL,
    Term,
    certify,
    expected_gradient,
    ingredients,
    judge,
    main,
    problem,
    target_gradients,
)
from algorithms.kl import kl_estimate

REGIME_NAMES = ("on_policy_token", "off_policy_token", "on_policy_sequence",
                "off_policy_sequence")


def verdicts(estimator, placement="loss", weight="none"):
    return {k: v.equals for k, v in certify(ingredients(estimator, placement, weight)).items()}


# --- the targets, against their closed forms --------------------------------------------------


def tree_parts(theta: torch.Tensor):
    """First-token probs [3] and second-token probs [3, 3] of the audit's tree."""
    return torch.softmax(theta[:3], -1), torch.softmax(theta[3:].view(3, 3), -1)


def closed_form_targets(regime: str) -> dict[str, torch.Tensor]:
    """grad KL(pi||ref) and grad KL(ref||pi) by the softmax Jacobian, no autograd.

    One token: d/dz KL(pi||ref) = pi (l - KL), d/dz KL(ref||pi) = pi - ref.
    Tree: with c(a) = l1(a) + KL(pi2(.|a) || ref2(.|a)), the first logits get pi1 (c - E c),
    row a of the second logits pi1(a) pi2 (l2 - KL2(a)); forward: pi1 - ref1 and
    ref1(a) (pi2 - ref2)."""
    p = problem(regime)
    if p.policy.name == "categorical":
        pi, ref = torch.softmax(p.theta, -1), torch.softmax(p.theta_ref, -1)
        log_ratio = (pi / ref).log()
        return {"reverse_kl": pi * (log_ratio - (pi * log_ratio).sum()), "forward_kl": pi - ref}
    pi1, pi2 = tree_parts(p.theta)
    ref1, ref2 = tree_parts(p.theta_ref)
    l1, l2 = (pi1 / ref1).log(), (pi2 / ref2).log()
    kl2 = (pi2 * l2).sum(-1)
    c = l1 + kl2
    rev = torch.cat([pi1 * (c - (pi1 * c).sum()),
                     (pi1[:, None] * pi2 * (l2 - kl2[:, None])).reshape(-1)])
    fwd = torch.cat([pi1 - ref1, (ref1[:, None] * (pi2 - ref2)).reshape(-1)])
    return {"reverse_kl": rev, "forward_kl": fwd}


@pytest.mark.parametrize("regime", REGIME_NAMES)
def test_targets_match_their_closed_forms(regime):
    assert list(REGIMES) == list(REGIME_NAMES)
    got, want = target_gradients(problem(regime)), closed_form_targets(regime)
    for name in ("reverse_kl", "forward_kl"):
        torch.testing.assert_close(got[name], want[name], rtol=1e-12, atol=1e-14)
    # the two targets differ, so a verdict tells them apart
    assert float((want["reverse_kl"] - want["forward_kl"]).norm()) > 1e-2 * float(
        want["reverse_kl"].norm())


def test_off_policy_differs_from_on_policy_only_in_the_sampler():
    for level in ("token", "sequence"):
        on, off = problem(f"on_policy_{level}"), problem(f"off_policy_{level}")
        assert torch.equal(on.theta, on.theta_old) and torch.equal(on.theta, off.theta)
        assert torch.equal(on.theta_ref, off.theta_ref)
        assert float((off.theta_old - off.theta).abs().min()) > 0


# --- the facts of issue 53 --------------------------------------------------------------------


@pytest.mark.parametrize("estimator,expected", [
    ("k1", "zero"), ("k2", "reverse_kl"), ("k3", "forward_kl"), ("low_var_kl", "forward_kl"),
    ("k1+", "reverse_kl"), ("k3+", "reverse_kl"), ("low_var_kl+", "reverse_kl"),
    ("abs", "none"),
])
def test_on_policy_token_in_the_loss(estimator, expected):
    assert verdicts(estimator)["on_policy_token"] == expected


@pytest.mark.parametrize("estimator", ["k2", "k3", "low_var_kl"])
def test_off_policy_unweighted_is_biased_for_both_directions(estimator):
    v = certify(ingredients(estimator))["off_policy_token"]
    assert v.equals == "none"
    assert v.rel_error_reverse > 1e-2 and v.rel_error_forward > 1e-2


@pytest.mark.parametrize("estimator,weight,expected", [
    ("k3", "ratio", "reverse_kl"),            # DeepSeek-V3.2: unbiased off-policy too
    ("k1", "ratio", "reverse_kl"),            # E_pi[k1] = KL as well
    ("k3", "ratio_detached", "forward_kl"),
    ("k2", "ratio_detached", "reverse_kl"),
    ("k1", "ratio_detached", "zero"),
])
def test_weighted_estimators_on_and_off_policy(estimator, weight, expected):
    v = verdicts(estimator, "loss", weight)
    assert (v["on_policy_token"], v["off_policy_token"]) == (expected, expected)


def test_k2_times_the_differentiated_ratio_is_biased():
    # grad (w k2) = w (k2 + l) grad log pi: E = E_pi[(k2 + l) grad log pi], k2's extra term
    v = verdicts("k2", "loss", "ratio")
    assert v["on_policy_token"] == v["off_policy_token"] == "none"


def per_token_on_policy_tree_gradient(estimator: str) -> torch.Tensor:
    """E_pi[sum_t grad k_t] on the tree, closed form: per-token k2 gives each token's own
    l_t grad log pi_t (no KL of the tokens after it); per-token k3 gives (pi_t - ref_t)."""
    p = problem("on_policy_sequence")
    pi1, pi2 = tree_parts(p.theta)
    ref1, ref2 = tree_parts(p.theta_ref)
    if estimator == "k2":
        l1, l2 = (pi1 / ref1).log(), (pi2 / ref2).log()
        kl2 = (pi2 * l2).sum(-1, keepdim=True)
        return torch.cat([pi1 * (l1 - (pi1 * l1).sum()),
                          (pi1[:, None] * pi2 * (l2 - kl2)).reshape(-1)])
    return torch.cat([pi1 - ref1, (pi1[:, None] * (pi2 - ref2)).reshape(-1)])


@pytest.mark.parametrize("estimator,about", [("k2", 0.16), ("k3", 0.40)])
def test_per_token_losses_miss_the_sequence_reverse_kl(estimator, about):
    """Tang & Munos 2506.09477: on two-token sequences, on-policy, the per-token k2/k3 loss
    misses the sequence reverse-KL gradient (issue 53 reports ~0.8 on its own policy; on the
    audit's draw it is 0.16 for k2 and 0.40 for k3, both derived here in closed form)."""
    p = problem("on_policy_sequence")
    g = expected_gradient(ingredients(estimator), p)
    closed = per_token_on_policy_tree_gradient(estimator)
    torch.testing.assert_close(g, closed, rtol=1e-10, atol=1e-14)
    rev = closed_form_targets("on_policy_sequence")["reverse_kl"]
    rel = float((closed - rev).norm() / rev.norm())
    v = certify(ingredients(estimator))["on_policy_sequence"]
    assert v.equals == "none"
    assert v.rel_error_reverse == pytest.approx(rel, rel=1e-9)
    assert rel == pytest.approx(about, abs=0.005)


@pytest.mark.parametrize("estimator", ["k1", "k1+"])  # k1+ has k1's value, all a reward uses
def test_k1_in_the_reward_is_the_exact_sequence_reverse_kl_on_policy(estimator):
    v = verdicts(estimator, "reward")
    assert v["on_policy_token"] == v["on_policy_sequence"] == "reverse_kl"
    # the penalty is frozen at pi_old: off-policy it is a penalty on the sampler
    assert v["off_policy_token"] == v["off_policy_sequence"] == "none"


def test_liu_et_al_k2_in_loss_equals_k1_in_reward_on_policy():
    """2510.01555: on-policy, k2 in the loss has the expected gradient of k1 in the reward
    placed on each token's own advantage, on sequences too (both E_pi[sum_t l_t grad log
    pi_t]); k1 summed to go (the exact sequence reverse KL) parts from both on sequences."""
    loss, own, to_go = ingredients("k2"), ingredients("k1", "reward_token"), \
        ingredients("k1", "reward")
    for regime in ("on_policy_token", "on_policy_sequence"):
        p = problem(regime)
        torch.testing.assert_close(expected_gradient(loss, p), expected_gradient(own, p),
                                   rtol=1e-12, atol=1e-15)
    tok, seq = problem("on_policy_token"), problem("on_policy_sequence")
    torch.testing.assert_close(expected_gradient(to_go, tok), expected_gradient(own, tok),
                               rtol=1e-12, atol=1e-15)  # one token: nothing after it
    gap = expected_gradient(loss, seq) - expected_gradient(to_go, seq)
    assert float(gap.norm()) > 1e-2 * float(expected_gradient(to_go, seq).norm())


@pytest.mark.parametrize("regime", REGIME_NAMES)
def test_k3_times_the_score_weight_is_k2_sample_by_sample(regime):
    """NeMo-RL's default weight exp(logp - SG(logp)): grad(e k3) = (k3 + 1 - r) grad log pi
    = -log r grad log pi = grad k2, on every sample; so reverse KL on-policy per token, and
    off-policy as biased as k2."""
    p = problem(regime)
    g_score, _ = Term("k3", "loss", "score").gradients(p)
    g_k2, _ = Term("k2", "loss").gradients(p)
    torch.testing.assert_close(g_score, g_k2, rtol=1e-12, atol=1e-15)
    v = verdicts("k3", "loss", "score")
    assert (v["on_policy_token"], v["off_policy_token"]) == ("reverse_kl", "none")


def test_no_setting_is_exact_off_policy_on_sequences():
    for estimator in ("k1", "k2", "k3"):
        for placement, weight in (("loss", "none"), ("loss", "ratio"),
                                  ("loss", "ratio_detached"), ("reward", "none")):
            assert verdicts(estimator, placement, weight)["off_policy_sequence"] in (
                "none", "zero")


def test_both_is_the_sum_of_its_terms():
    p = problem("on_policy_sequence")
    both = expected_gradient(ingredients("k3", "both", "ratio"), p)
    parts = (expected_gradient(ingredients("k3", "loss", "ratio"), p)
             + expected_gradient(ingredients("k3", "reward"), p))
    torch.testing.assert_close(both, parts, rtol=1e-12, atol=1e-15)
    assert verdicts("k1", "both")["on_policy_sequence"] == "reverse_kl"  # zero + exact


def test_no_kl_term_is_zero_everywhere():
    assert set(verdicts("k1", "none").values()) == {"zero"}


def test_judge_thresholds():
    rev = torch.tensor([1.0, 0.0], dtype=torch.float64)
    fwd = torch.tensor([0.0, 1.0], dtype=torch.float64)
    t = {"reverse_kl": rev, "forward_kl": fwd}
    assert judge(rev * (1 + 0.5 * TOL), t).equals == "reverse_kl"
    assert judge(rev * (1 + 2 * TOL), t).equals == "none"
    assert judge(fwd, t).equals == "forward_kl"
    assert judge(rev * 0.5 * TOL, t).equals == "zero"


@pytest.mark.parametrize("regime", REGIME_NAMES)
def test_the_clamps_are_inactive_on_the_draws(regime):
    """low_var_kl is k3 (value and gradient) at every token of pi and pi_old against ref."""
    p = problem(regime)
    ref = p.policy.token_logps(p.theta_ref)
    for theta in (p.theta, p.theta_old):
        logp = p.policy.token_logps(theta.clone().requires_grad_(True))
        lv, k3 = kl_estimate(logp, ref, "low_var_kl"), kl_estimate(logp, ref, "k3")
        assert torch.equal(lv, k3)
        assert float((ref - logp.detach()).abs().max()) < 1.2
        (g_lv,) = torch.autograd.grad(lv.sum(), logp, retain_graph=True)
        (g_k3,) = torch.autograd.grad(k3.sum(), logp)
        assert torch.equal(g_lv, g_k3)


# --- the new estimators by hand ---------------------------------------------------------------


def test_abs_and_low_var_kl_values():
    logp = torch.tensor([[-1.0, -2.0, -40.0, -0.5]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.0, -1.0, -0.5]], dtype=torch.float64)
    log_r = ref - logp  # -0.5, 1, 39, 0
    torch.testing.assert_close(kl_estimate(logp, ref, "abs"), log_r.abs())
    k3 = log_r.exp() - 1 - log_r
    lv = kl_estimate(logp, ref, "low_var_kl")
    torch.testing.assert_close(lv[:, [0, 1, 3]], k3[:, [0, 1, 3]])
    assert float(lv[0, 2]) == 10.0  # e^39 - 40 clamped to verl's 10


def test_low_var_kl_has_no_gradient_where_clamped():
    logp = torch.tensor([[-40.0, -1.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.0, -1.5]], dtype=torch.float64)
    (g,) = torch.autograd.grad(kl_estimate(logp, ref, "low_var_kl").sum(), logp)
    assert float(g[0, 0]) == 0.0
    assert float(g[0, 1]) == pytest.approx(1 - math.exp(-0.5), rel=1e-12)


@pytest.mark.parametrize("name", ["k1", "abs", "k3", "low_var_kl"])
def test_plus_variants_have_the_value_of_k_and_the_gradient_of_k2(name):
    logp = torch.tensor([[-1.0, -2.0, -0.3]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -0.3]], dtype=torch.float64)
    plus = kl_estimate(logp, ref, f"{name}+")
    torch.testing.assert_close(plus.detach(), kl_estimate(logp, ref, name).detach())
    (g,) = torch.autograd.grad(plus.sum(), logp)
    torch.testing.assert_close(g, (logp - ref).detach())  # d/dlogp (logp - ref)^2 / 2


# --- ingredients and the command line ---------------------------------------------------------


def test_a_reward_term_takes_no_weight():
    with pytest.raises(ValueError, match="weight='ratio' applies to a KL in the loss"):
        ingredients("k1", "reward", "ratio")
    with pytest.raises(ValueError, match="use weight='none'"):
        Term("k1", "reward", "ratio_detached")


def test_json_output(capsys):
    assert main(["--estimator", "k3", "--placement", "loss", "--weight", "none", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == list(REGIME_NAMES)
    for v in out.values():
        assert set(v) == {"equals", "rel_error_reverse", "rel_error_forward"}
    assert out["on_policy_token"]["equals"] == "forward_kl"
    assert out["on_policy_token"]["rel_error_forward"] < TOL


def test_framework_json_output(capsys):
    argv = ["--framework", "verl", "use_kl_loss=true", "kl_loss_type=low_var_kl", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["framework"], out["peer_accepts"]) == ("verl", True)
    assert [v["equals"] for v in out["verdicts"].values()] == ["forward_kl", "none", "none",
                                                               "none"]


def test_a_setting_the_framework_rejects_exits_3_naming_the_raise(capsys):
    argv = ["--framework", "verl", "use_kl_loss=true", "kl_loss_type=k3+"]
    assert main(argv) == 3
    err = capsys.readouterr().err.strip()
    assert err == ("certify: verl b178a3c rejects kl_loss_type=k3+: kl_penalty_forward raises "
                   "NotImplementedError, verl/trainer/ppo/core_algos.py:1902")
    assert main([*argv, "--json"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert out["peer_accepts"] is False and "NotImplementedError" in out["peer_refusal"]


@pytest.mark.parametrize("beta", ["nan", "inf", "-1"])
def test_a_non_finite_or_negative_coefficient_exits_2(capsys, beta):
    assert main(["--framework", "trl", f"beta={beta}"]) == 2
    assert "give a finite number >= 0" in capsys.readouterr().err


def test_plain_verdict(capsys):
    assert main(["--estimator", "k2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("k2 in loss\n")
    assert "on_policy_token      the reverse-KL gradient" in out


@pytest.mark.parametrize("argv,names", [
    (["--framework", "nope"], "choose one of ['verl', 'trl', 'openrlhf', 'slime', 'nemo-rl', "
                              "'skyrl']"),
    (["--framework", "verl", "foo=1"], "its options: ['use_kl_loss', 'kl_loss_type'"),
    (["--framework", "verl", "kl_loss_type=K3"], "choose one of ['kl', 'k1', 'abs', 'mse'"),
    (["--estimator", "k9"], "estimator='k9' is not registered; choose one of ['k1', 'k2'"),
    (["--estimator", "k1", "--placement", "side"], "choose one of ['loss', 'reward', "
                                                    "'reward_token', 'both', 'none']"),
    (["--estimator", "k1", "--weight", "w"], "choose one of ['none', 'ratio', 'ratio_detached', "
                                             "'score']"),
    (["--estimator", "k1", "use_kl_loss=true"], "framework options need --framework"),
    ([], "give --framework"),
])
def test_bad_input_is_one_line_naming_what_is_accepted(argv, names, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and names in captured.err


def test_the_score_weight_keeps_the_value():
    """kl_importance_weight='score' multiplies by exp(logw - SG(logw)) = 1: the loss value is
    the unweighted one, whatever pi_old is (only the gradient changes)."""
    from algorithms import LossConfig, compute_policy_loss

    logp = torch.tensor([[-1.0, -2.0, -0.3]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.2, -1.0, -0.9]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.0, -0.3]], dtype=torch.float64)
    values = {}
    for weight in ("none", "score", "differentiable"):
        cfg = LossConfig(objective="ppo", estimator="k3", kl_placement="loss",
                         kl_importance_weight=weight, beta=1.0)
        loss, _ = compute_policy_loss(cfg, logp, old, ref, torch.zeros(1), torch.ones(1, 3))
        values[weight] = float(loss.detach())
    assert values["score"] == pytest.approx(values["none"], rel=1e-15)
    assert values["differentiable"] != pytest.approx(values["none"], rel=1e-3)
