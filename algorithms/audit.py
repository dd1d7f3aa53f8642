"""Exact-gradient audit: does each surrogate's expected gradient equal the intended one?

    python -m algorithms.audit --out results/audit      # writes audit.csv and audit.md

Small tabular softmax policies in float64, enumerated exactly (no sampling):
  * "categorical": one token with K = 4 outcomes;
  * "tree": two tokens, K1 = 3 first tokens each with its own 3-way second token.
For a loss config, the intended objective is J = E_pi[R] - beta * D(pi, ref) with D its
divergence on whole sequences; its gradient comes from autograd on the closed form. The
surrogate's expected gradient is sum_y mu(y) grad L(y), calling `compute_policy_loss` once
per outcome y (with token-sum aggregation so a sequence's loss is the sum of its tokens').

Scenarios (theta = current, theta_old = sampler mu, theta_ref = reference):
  at_old       theta = theta_old = theta_ref     (the start of every RPG step)
  on_policy    theta = theta_old != theta_ref    (fixed reference, as in GRPO)
  off_policy   theta != theta_old = theta_ref    (the paper's setting, |delta| ~ 0.5)
  ref_differs  theta != theta_old != theta_ref   (reference differs from the sampler)

Reported per row and scenario: relative bias of the full gradient (||E grad L + grad J|| /
||grad J||), of the KL part alone (R = 0), which divergence the KL part actually descends,
and the per-sample gradient variance (trace of the covariance) of the full and KL parts.

Three policies (`run_correction_audit`, audit_corrections.*): the samples come from a sampler
mu that is not pi_old, with theta != theta_old != theta_ref as in ref_differs:
  mismatch <s>  theta_mu = theta_old + s * noise (a kernel/precision mismatch, as bf16)
  stale         theta_mu = 2 theta_old - theta (the policy one update before pi_old)
For each RPG divergence x form (sequence ratio: exact when mu = pi_old) x `rollout.correction`
mode (algorithms.correction), on the two-token tree (one token would make token and sequence
corrections the same): the bias of E_mu[grad L] against grad J and the per-sample gradient
variance under mu.
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
import torch

from .advantages import token_returns
from .config import DIVERGENCES, ESTIMATORS, LossConfig
from .correction import CORRECTIONS, CorrectionConfig
from .kl import divergence, kl_reward_penalty
from .losses import compute_policy_loss
from .methods import METHODS

DTYPE = torch.float64
BETA = 0.1  # large enough that the KL part is visible next to the reward part
EXACT_TOL = 1e-8


# --- tabular policies ------------------------------------------------------------------------


@dataclass(frozen=True)
class Tabular:
    """A softmax policy over enumerable sequences: theta -> token log-probs [N, T]."""

    name: str
    n_params: int
    n_outcomes: int
    n_tokens: int

    def token_logps(self, theta: torch.Tensor) -> torch.Tensor:
        if self.name == "categorical":
            return torch.log_softmax(theta, -1)[:, None]  # (K, 1)
        k1 = int(round(self.n_outcomes ** 0.5))
        first = torch.log_softmax(theta[:k1], -1)  # (K1,)
        second = torch.log_softmax(theta[k1:].view(k1, k1), -1)  # (K1, K2)
        a = torch.arange(k1).repeat_interleave(k1)  # first token of each outcome
        b = torch.arange(k1).repeat(k1)  # second token
        return torch.stack([first[a], second[a, b]], -1)  # (K1*K2, 2)

    def seq_probs(self, theta: torch.Tensor) -> torch.Tensor:
        return self.token_logps(theta).sum(-1).exp()  # (N,)


CATEGORICAL = Tabular("categorical", n_params=4, n_outcomes=4, n_tokens=1)
TREE = Tabular("tree", n_params=3 + 9, n_outcomes=9, n_tokens=2)
POLICIES = {"categorical": CATEGORICAL, "tree": TREE}
SCENARIOS = ("at_old", "on_policy", "off_policy", "ref_differs")


@dataclass
class Problem:
    """One audit instance: a policy family, parameters for pi, mu, ref and rewards."""

    policy: Tabular
    theta: torch.Tensor
    theta_old: torch.Tensor
    theta_ref: torch.Tensor
    rewards: torch.Tensor  # (N,)
    theta_mu: torch.Tensor | None = None  # the sampler's parameters (None: the sampler is pi_old)


def make_problem(policy: Tabular, scenario: str, seed: int = 0, delta: float = 0.5) -> Problem:
    """Deterministic parameters for `scenario`; perturbations have norm ~ delta per entry."""
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(policy.n_params, generator=g, dtype=DTYPE)
    d_old = delta * torch.randn(policy.n_params, generator=g, dtype=DTYPE)
    d_ref = delta * torch.randn(policy.n_params, generator=g, dtype=DTYPE)
    rewards = torch.randn(policy.n_outcomes, generator=g, dtype=DTYPE)
    old = {"at_old": theta, "on_policy": theta}.get(scenario, theta + d_old)
    ref = {"at_old": theta, "on_policy": theta + d_ref, "off_policy": old}.get(scenario, theta + d_ref)
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario={scenario!r}; choose one of {SCENARIOS}")
    return Problem(policy, theta.clone(), old.clone(), ref.clone(), rewards)


# --- exact and surrogate gradients ---------------------------------------------------------------


def exact_gradient(p: Problem, div: str | None, beta: float, with_reward: bool = True):
    """grad_theta of E_pi[R] - beta * D(pi, ref) on sequences, by autograd."""
    theta = p.theta.clone().requires_grad_(True)
    pi = p.policy.seq_probs(theta)
    ref = p.policy.seq_probs(p.theta_ref)
    j = (pi * p.rewards).sum() if with_reward else pi.sum() * 0.0
    if div is not None:
        j = j - beta * divergence(div, pi, ref)
    (grad,) = torch.autograd.grad(j, theta)
    return grad


def surrogate_gradients(p: Problem, cfg: LossConfig, with_reward: bool = True,
                        correction: CorrectionConfig | None = None):
    """Per-outcome gradients grad L(y) [N, P] and sampling probabilities mu(y) [N]; the
    samples come from theta_mu when the problem has one, corrected by `correction`."""
    cfg = cfg.model_copy(update={"agg": "seq-mean-token-sum"})
    old_lp = p.policy.token_logps(p.theta_old)
    ref_lp = p.policy.token_logps(p.theta_ref)
    mu_lp = old_lp if p.theta_mu is None else p.policy.token_logps(p.theta_mu)
    mu = mu_lp.sum(-1).exp()
    rewards = p.rewards if with_reward else torch.zeros_like(p.rewards)
    mask = torch.ones_like(old_lp)
    penalty = kl_reward_penalty(cfg, old_lp, ref_lp, mask)
    adv = token_returns(rewards, penalty, mask)  # [N] or [N, T]
    theta = p.theta.clone().requires_grad_(True)
    logp = p.policy.token_logps(theta)  # one graph, differentiated once per outcome
    grads = []
    for i in range(p.policy.n_outcomes):
        loss, _ = compute_policy_loss(cfg, logp[i : i + 1], old_lp[i : i + 1], ref_lp[i : i + 1],
                                      adv[i : i + 1], mask[i : i + 1],
                                      mu_logp=mu_lp[i : i + 1], correction=correction)
        (g,) = torch.autograd.grad(loss, theta, retain_graph=True)
        grads.append(g)
    return torch.stack(grads), mu


def _rel(err: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative error; absolute when the reference gradient vanishes (both ~0 is exact)."""
    scale = float(ref.norm())
    return float(err.norm()) / scale if scale > 1e-12 else float(err.norm())


@dataclass
class AuditResult:
    rel_bias: float  # full gradient
    rel_bias_kl: float  # KL part alone (R = 0)
    descends: str  # which divergence's gradient the KL part equals ("none" if neither)
    variance: float  # per-sample gradient variance, full
    variance_kl: float  # per-sample gradient variance, KL part


def audit_one(p: Problem, cfg: LossConfig, intended: str) -> AuditResult:
    beta = cfg.beta
    g_full, mu = surrogate_gradients(p, cfg, with_reward=True)
    g_kl, _ = surrogate_gradients(p, cfg, with_reward=False)
    mean_full, mean_kl = mu @ g_full, mu @ g_kl
    target_full = exact_gradient(p, intended, beta)
    target_kl = exact_gradient(p, intended, beta, with_reward=False)
    descends = "none"
    for name, label in (("fkl", "KL(ref||pi)"), ("rkl", "KL(pi||ref)"),
                        ("js", "(KL(pi||ref)+KL(ref||pi))/2")):
        t = exact_gradient(p, name, beta, with_reward=False)
        if float(t.norm()) > 1e-12 and _rel(mean_kl + t, t) < 1e-6:
            descends = label
    if float(target_kl.norm()) <= 1e-12:
        descends = "n/a (grad D = 0)"

    def var(g, m):
        return float((mu[:, None] * (g - m) ** 2).sum())

    return AuditResult(
        rel_bias=_rel(mean_full + target_full, target_full),
        rel_bias_kl=_rel(mean_kl + target_kl, target_kl),
        descends=descends,
        variance=var(g_full, mean_full),
        variance_kl=var(g_kl, mean_kl),
    )


# --- the audited rows ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    name: str
    family: str
    cfg: LossConfig
    intended: str | None  # divergence whose gradient the loss follows (None: E[R], no KL)


def audit_rows(beta: float = BETA) -> list[Row]:
    """Every RPG variant x form x ratio level, and the k1/k2/k3 penalties."""
    rows = []
    for div, form, level in itertools.product(
        DIVERGENCES.names(), ("differentiable", "reinforce"),
        ("token", "sequence")
    ):
        cfg = LossConfig(objective="rpg", divergence=div, form=form, ratio_level=level, beta=beta)
        rows.append(Row(f"RPG-{div.upper()} {form} {level}", "rpg", cfg, div))
    for est, iw in itertools.product(ESTIMATORS.names(), ("none", "detached", "differentiable")):
        cfg = LossConfig(objective="ppo", estimator=est, kl_placement="loss",
                         kl_importance_weight=iw, beta=beta)
        label = {"none": "no IW", "detached": "SG(w) IW", "differentiable": "w IW"}[iw]
        rows.append(Row(f"{est} in loss, {label}", "penalty", cfg, "rkl"))
    for est in ESTIMATORS.names():
        cfg = LossConfig(objective="ppo", estimator=est, kl_placement="reward", beta=beta)
        rows.append(Row(f"{est} in reward", "penalty", cfg, "rkl"))
    rows += design_rows(beta)
    return rows


def design_rows(beta: float = BETA) -> list[Row]:
    """The designs run beside RPG, as their methods run them (no KL: the target is E[R]), and
    CISPO / clipped REINFORCE with k1 in the reward against the reverse-KL objective. The
    advantage is the raw reward here: a baseline (RLOO's leave-one-out) leaves the expected
    gradient unchanged, so RLOO's row is its clipped REINFORCE loss."""
    rows = [Row(f"{name} (no KL)", "design", METHODS[name].loss, None)
            for name in ("RLOO", "GSPO", "CISPO")]
    for name in ("RLOO", "CISPO"):
        cfg = METHODS[name].loss.model_copy(
            update={"estimator": "k1", "kl_placement": "reward", "beta": beta})
        rows.append(Row(f"{name}, k1 in reward", "design",
                        LossConfig.model_validate(cfg.model_dump()), "rkl"))
    return rows


NO_KL_LABEL = "none (J = E[R])"  # a design without a KL term: its target is E_pi[R]


def run_audit(seed: int = 0, beta: float = BETA, policies=tuple(POLICIES)) -> pd.DataFrame:
    """The long table: one line per (policy, row, scenario)."""
    records = []
    for pname, row in itertools.product(policies, audit_rows(beta)):
        policy = POLICIES[pname]
        for scenario in SCENARIOS:
            res = audit_one(make_problem(policy, scenario, seed), row.cfg, row.intended)
            records.append({
                "policy": pname, "loss": row.name, "family": row.family,
                "intended": DIVERGENCES[row.intended].label if row.intended else NO_KL_LABEL,
                "scenario": scenario,
                "rel_bias": res.rel_bias, "rel_bias_kl": res.rel_bias_kl,
                "descends": res.descends, "variance": res.variance,
                "variance_kl": res.variance_kl,
            })
    return pd.DataFrame.from_records(records)


# --- three policies: the sampler mu is not pi_old ------------------------------------------------

MISMATCH_SIZES = (0.1, 0.3, 1.0)
SAMPLER_SCENARIOS = (*(f"mismatch {s:g}" for s in MISMATCH_SIZES), "stale")
CORRECTION_DIVERGENCES = ("fkl", "ufkl", "rkl", "urkl")  # the paper's four


def make_sampler_problem(policy: Tabular, scenario: str, seed: int = 0) -> Problem:
    """ref_differs (theta, theta_old, theta_ref all differ) plus a sampler theta_mu: pi_old's
    parameters plus noise of the scenario's size per entry, or (stale) the policy one update
    before pi_old along the same direction, theta_mu = theta_old - (theta - theta_old)."""
    p = make_problem(policy, "ref_differs", seed)
    if scenario == "stale":
        return replace(p, theta_mu=2 * p.theta_old - p.theta)
    if scenario not in SAMPLER_SCENARIOS:
        raise ValueError(f"scenario={scenario!r}; choose one of {SAMPLER_SCENARIOS}")
    size = float(scenario.removeprefix("mismatch "))
    g = torch.Generator().manual_seed(seed + 1)
    return replace(p, theta_mu=p.theta_old + size * torch.randn(policy.n_params, generator=g,
                                                                dtype=DTYPE))


def run_correction_audit(seed: int = 0, beta: float = BETA, cap: float = 2.0,
                         divergences=CORRECTION_DIVERGENCES) -> pd.DataFrame:
    """The long table: one line per (RPG divergence x form, correction mode, scenario)."""
    records = []
    problems = {sc: make_sampler_problem(TREE, sc, seed) for sc in SAMPLER_SCENARIOS}
    for div, form in itertools.product(divergences, ("differentiable", "reinforce")):
        # Sequence ratios: exact when mu = pi_old (the token ratio is biased on the tree even
        # then, see the main table), so every bias here is the mismatch's or its correction's.
        cfg = LossConfig(objective="rpg", divergence=div, form=form, ratio_level="sequence",
                         beta=beta)
        for mode, (scenario, p) in itertools.product(CORRECTIONS, problems.items()):
            g, mu = surrogate_gradients(p, cfg, correction=CorrectionConfig(mode=mode, cap=cap))
            mean = mu @ g
            target = exact_gradient(p, div, beta)
            records.append({
                "policy": TREE.name, "loss": f"RPG-{div.upper()} {form} sequence", "mode": mode,
                "scenario": scenario, "rel_bias": _rel(mean + target, target),
                "variance": float((mu[:, None] * (g - mean) ** 2).sum()),
            })
    return pd.DataFrame.from_records(records)


def correction_table(df: pd.DataFrame) -> pd.DataFrame:
    """Wide view: one line per (loss, mode), bias and variance per scenario."""
    wide = []
    for (loss, mode), g in df.groupby(["loss", "mode"], sort=False):
        s = g.set_index("scenario")
        wide.append({
            "loss": loss, "correction": mode,
            **{f"bias {sc}": _fmt(s.at[sc, "rel_bias"]) for sc in SAMPLER_SCENARIOS},
            "variance " + " / ".join(sc.removeprefix("mismatch ") for sc in SAMPLER_SCENARIOS):
                " / ".join(f"{s.at[sc, 'variance']:.3g}" for sc in SAMPLER_SCENARIOS),
        })
    return pd.DataFrame(wide)


def _fmt(x: float) -> str:
    return "0 (exact)" if x < EXACT_TOL else f"{x:.2e}"


def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """Wide, readable view: one line per (policy, loss)."""
    order = {name: i for i, name in enumerate(dict.fromkeys(df["loss"]))}
    wide = []
    for (policy, loss), g in df.groupby(["policy", "loss"], sort=False):
        s = g.set_index("scenario")
        wide.append({
            "policy": policy, "loss": loss, "intended": s["intended"].iloc[0],
            "bias on-policy": _fmt(s.at["on_policy", "rel_bias"]),
            "bias off-policy": _fmt(s.at["off_policy", "rel_bias"]),
            "bias ref != sampler": _fmt(s.at["ref_differs", "rel_bias"]),
            "KL-part bias on / off / ref": " / ".join(
                _fmt(s.at[sc, "rel_bias_kl"]) for sc in ("on_policy", "off_policy", "ref_differs")),
            "KL part descends (on-policy)": s.at["on_policy", "descends"],
            "KL-part var at theta_old": f"{s.at['at_old', 'variance_kl']:.2e}",
            "_order": order[loss],
        })
    out = pd.DataFrame(wide).sort_values(["policy", "_order"]).drop(columns="_order")
    return out.reset_index(drop=True)


CORRECTIONS_HEADER = (
    "float64, exact enumeration on the two-token tree, RPG sequence ratios, beta = {beta}, "
    "seed = {seed}, cap = 2: samples from mu, theta != theta_old != theta_ref. Bias is ||E_mu[grad L] + grad J|| / "
    "||grad J||; variance is the trace of the per-sample gradient covariance under mu "
    "(mismatch sizes / stale). Generated by `python -m algorithms.audit`.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/audit"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--beta", type=float, default=BETA)
    parser.add_argument("--policies", nargs="+", choices=list(POLICIES), default=list(POLICIES))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # tiny tensors: extra threads only add synchronisation cost
    df = run_audit(args.seed, args.beta, tuple(args.policies))
    args.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out / "audit_long.csv", index=False)
    table = summary_table(df)
    table.to_csv(args.out / "audit.csv", index=False)
    header = (
        "# Exact-gradient audit\n\n"
        f"float64, exact enumeration, beta = {args.beta}, seed = {args.seed}. Bias is "
        "||E_mu[grad L] + grad J|| / ||grad J|| for J = E_pi[R] - beta * D (intended D); "
        f"'0 (exact)' means below {EXACT_TOL:g}. Generated by `python -m algorithms.audit`.\n\n"
    )
    (args.out / "audit.md").write_text(header + table.to_markdown(index=False) + "\n")
    print(table.to_markdown(index=False))
    if "tree" not in args.policies:  # the corrections' audit runs on the tree
        print(f"\nwrote {args.out / 'audit.md'}, {args.out / 'audit.csv'}, "
              f"{args.out / 'audit_long.csv'}")
        return 0
    corrections = run_correction_audit(args.seed, args.beta)
    corrections.to_csv(args.out / "audit_corrections_long.csv", index=False)
    wide = correction_table(corrections)
    wide.to_csv(args.out / "audit_corrections.csv", index=False)
    (args.out / "audit_corrections.md").write_text(
        "# Off-policy corrections: exact bias and variance\n\n" + CORRECTIONS_HEADER.format(
            beta=args.beta, seed=args.seed) + "\n\n" + wide.to_markdown(index=False) + "\n")
    print("\n" + wide.to_markdown(index=False))
    print(f"\nwrote {args.out / 'audit.md'}, {args.out / 'audit.csv'}, {args.out / 'audit_long.csv'}"
          f", {args.out / 'audit_corrections.md'} (.csv, _long.csv)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
