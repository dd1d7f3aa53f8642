"""Which gradient does a KL setting compute? An exact certificate, by enumeration.

    python -m algorithms.certify --estimator k3 --placement loss --weight none
    python -m algorithms.certify --framework verl use_kl_loss=true kl_loss_type=low_var_kl
    python -m algorithms.certify --framework trl beta=0.04 use_bias_correction_kl=true --json

A setting is a sum of KL terms (`Term`), each made of the ingredients every RL framework
offers under its own names (algorithms/peers.py maps them):
  estimator  a registered KL estimator of algorithms/kl.py (k1, k2, k3, abs, low_var_kl, "+");
  placement  "loss": beta * k(pi, ref) added to the loss, differentiated through pi;
             "reward": -beta * k(pi_old, ref) subtracted from the reward (a value, no gradient)
             and turned into a cost-to-go G_t = -sum_{s>=t} k_s, used by REINFORCE with the
             detached token ratio SG(pi/pi_old) (PPO's unclipped gradient is the same; a
             whole-sequence sum instead of the cost-to-go has the same expectation);
             "reward_token": the same penalty as each token's own advantage, -k_t, not
             summed to go (REINFORCE++ as NeMo-RL and slime's baseline variant compute it);
             "both" = "loss" + "reward"; "none" = no KL term at all;
  weight     of a loss term: "none", "ratio" (pi/pi_old, differentiated, DeepSeek-V3.2),
             "ratio_detached" (SG(pi/pi_old)) or "score" (exp(log pi - SG(log pi)): value 1,
             the ratio's gradient at pi; NeMo-RL's default); a reward term is weighted as the
             reward is.

Every term is per token (the level all peers use): the loss sums the per-token terms of a
sequence, the ratio is the token's. Each is computed by `compute_policy_loss` itself, through
the audit's enumerator (`algorithms.audit.surrogate_gradients`), and only the KL part is
kept (reward R = 0, beta = 1: the verdict does not depend on beta).

Regimes (the audit's tabular softmax policies and its parameter draws at seed 0, float64):
  on_policy_token      one token, K = 4 outcomes; samples from pi (theta_old = theta), a
                       reference ref != pi (the audit's "on_policy" draw);
  off_policy_token     the same policy; samples from an older policy pi_old != pi, ref
                       differing from both (the audit's "ref_differs" draw);
  on_policy_sequence   two tokens, 3 x 3 sequences, each first token with its own second-
                       token softmax (the audit's "tree"); samples from pi;
  off_policy_sequence  the tree, samples from pi_old, ref differing from both.

Target gradients, on whole outcomes y (one token, or a two-token sequence):
  reverse_kl  grad_theta KL(pi || ref) = grad sum_y pi(y) log(pi(y) / ref(y));
  forward_kl  grad_theta KL(ref || pi) = -grad sum_y ref(y) log pi(y);
both by autograd on the closed form (`algorithms.audit.exact_gradient`), and checked against
their own closed forms in tests/algorithms/test_certify.py.

The setting's expected gradient is g = sum_y mu(y) grad L(y), mu the sampler (pi or pi_old).
rel_error_X = ||g - grad X|| / ||grad X||. The verdict `equals` is reverse_kl when
rel_error_reverse < TOL, else forward_kl when rel_error_forward < TOL, else zero when
||g|| / ||grad KL(pi || ref)|| < TOL, else none. TOL = 1e-9 is far above float64 round-off
(an equality holds to ~1e-15 here) and far below every real bias (> 0.07 on these draws for
every registered setting and ingredient).
The clamps of low_var_kl and of the peers' estimators are inactive on these draws
(|log r| < 1.2 for pi and pi_old against ref; the value clamp k3 <= 10 starts at
log r ~ 2.5), so a clamped estimator is certified as the estimator it clamps.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

import torch

from .audit import (
    CATEGORICAL,
    TREE,
    Problem,
    Tabular,
    exact_gradient,
    make_problem,
    surrogate_gradients,
)
from .config import ESTIMATORS, LossConfig
from .kl import kl_estimate
from .losses import compute_policy_loss
from .registry import Registry

TOL = 1e-9
SEED = 0  # the audit's default draw; pinned by the tests' numbers

# name -> (policy, the audit's scenario)
REGIMES: Registry[tuple[Tabular, str]] = Registry("regime")
REGIMES.register("on_policy_token", (CATEGORICAL, "on_policy"))
REGIMES.register("off_policy_token", (CATEGORICAL, "ref_differs"))
REGIMES.register("on_policy_sequence", (TREE, "on_policy"))
REGIMES.register("off_policy_sequence", (TREE, "ref_differs"))

# a loss term's weight -> LossConfig.kl_importance_weight
WEIGHTS: Registry[str] = Registry("weight")
WEIGHTS.register("none", "none")
WEIGHTS.register("ratio", "differentiable")
WEIGHTS.register("ratio_detached", "detached")
WEIGHTS.register("score", "score")

# a placement -> the placements of its terms
PLACEMENTS: Registry[tuple[str, ...]] = Registry("placement")
PLACEMENTS.register("loss", ("loss",))
PLACEMENTS.register("reward", ("reward",))
PLACEMENTS.register("reward_token", ("reward_token",))
PLACEMENTS.register("both", ("loss", "reward"))
PLACEMENTS.register("none", ())

VERDICTS = ("reverse_kl", "forward_kl", "zero", "none")


@dataclass(frozen=True)
class Term:
    """One KL term: a registered estimator, placed in the loss or the reward, weighted."""

    estimator: str
    placement: str  # one of TERM_PLACEMENTS
    weight: str = "none"  # a WEIGHTS name; "none" for a reward term

    def __post_init__(self) -> None:
        ESTIMATORS.get(self.estimator)
        WEIGHTS.get(self.weight)
        if self.placement not in TERM_PLACEMENTS:
            raise ValueError(f"term placement={self.placement!r}; choose one of "
                             f"{list(TERM_PLACEMENTS)}")
        if self.placement != "loss" and self.weight != "none":
            raise ValueError(f"weight={self.weight!r} applies to a KL in the loss; a KL in "
                             "the reward is weighted as the reward is: use weight='none'")

    def gradients(self, p: Problem) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-outcome gradients of this term alone [N, P] (beta = 1, no clip, R = 0) and
        the sampler's probabilities [N]."""
        if self.placement == "loss":
            cfg = LossConfig(objective="ppo", estimator=self.estimator, kl_placement="loss",
                             kl_importance_weight=WEIGHTS[self.weight], beta=1.0)
        elif self.placement == "reward":
            cfg = LossConfig(objective="reinforce", estimator=self.estimator,
                             kl_placement="reward", beta=1.0)
        else:
            return own_token_reward_gradients(p, self.estimator)
        return surrogate_gradients(p, cfg, with_reward=False)

    def label(self) -> str:
        weight = {"none": "", "ratio": " x ratio", "ratio_detached": " x SG(ratio)",
                  "score": " x exp(logp - SG(logp))"}
        where = {"loss": "loss", "reward": "reward (to go)", "reward_token": "reward (own token)"}
        return f"{self.estimator}{weight[self.weight]} in {where[self.placement]}"


TERM_PLACEMENTS = ("loss", "reward", "reward_token")
Setting = tuple[Term, ...]


def own_token_reward_gradients(p: Problem, estimator: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A reward KL that stays on its token: advantage -k_t(pi_old, ref) [N, T], no sum to
    go, through REINFORCE's loss (`compute_policy_loss`, token sum per sequence), one call per
    outcome as `surrogate_gradients` does for the cost-to-go."""
    cfg = LossConfig(objective="reinforce", agg="seq-mean-token-sum")
    old_lp = p.policy.token_logps(p.theta_old)
    ref_lp = p.policy.token_logps(p.theta_ref)
    adv = -kl_estimate(old_lp, ref_lp, estimator)
    mask = torch.ones_like(old_lp)
    theta = p.theta.clone().requires_grad_(True)
    logp = p.policy.token_logps(theta)
    grads = []
    for i in range(p.policy.n_outcomes):
        rows = slice(i, i + 1)
        loss, _ = compute_policy_loss(cfg, logp[rows], old_lp[rows], ref_lp[rows], adv[rows],
                                      mask[rows])
        grads.append(torch.autograd.grad(loss, theta, retain_graph=True)[0])
    return torch.stack(grads), old_lp.sum(-1).exp()


def ingredients(estimator: str, placement: str = "loss", weight: str = "none") -> Setting:
    """Raw ingredients -> a Setting; the weight goes to the loss term of "both"."""
    ESTIMATORS.get(estimator)
    WEIGHTS.get(weight)
    places = PLACEMENTS.get(placement)
    if weight != "none" and "loss" not in places:
        raise ValueError(f"weight={weight!r} applies to a KL in the loss; with "
                         f"placement={placement!r} use weight='none'")
    return tuple(Term(estimator, p, weight if p == "loss" else "none") for p in places)


def describe(setting: Setting) -> str:
    return " + ".join(t.label() for t in setting) or "no KL term"


# --- the certificate -------------------------------------------------------------------------


def problem(regime: str) -> Problem:
    policy, scenario = REGIMES.get(regime)
    return make_problem(policy, scenario, SEED)


def expected_gradient(setting: Setting, p: Problem) -> torch.Tensor:
    """sum_y mu(y) grad L(y) of the setting's KL terms [P]; zero for no term."""
    total = torch.zeros(p.policy.n_params, dtype=p.theta.dtype)
    for term in setting:
        grads, mu = term.gradients(p)
        total = total + mu @ grads
    return total


def target_gradients(p: Problem) -> dict[str, torch.Tensor]:
    """grad KL(pi||ref) and grad KL(ref||pi) on whole outcomes (exact_gradient returns the
    gradient of J = -beta D, hence the sign)."""
    return {"reverse_kl": -exact_gradient(p, "rkl", 1.0, with_reward=False),
            "forward_kl": -exact_gradient(p, "fkl", 1.0, with_reward=False)}


@dataclass(frozen=True)
class Verdict:
    equals: str  # one of VERDICTS
    rel_error_reverse: float
    rel_error_forward: float

    def as_dict(self) -> dict:
        return {"equals": self.equals, "rel_error_reverse": self.rel_error_reverse,
                "rel_error_forward": self.rel_error_forward}


def judge(g: torch.Tensor, targets: dict[str, torch.Tensor]) -> Verdict:
    rev, fwd = targets["reverse_kl"], targets["forward_kl"]
    err_rev = float((g - rev).norm() / rev.norm())
    err_fwd = float((g - fwd).norm() / fwd.norm())
    if err_rev < TOL:
        equals = "reverse_kl"
    elif err_fwd < TOL:
        equals = "forward_kl"
    elif float(g.norm() / rev.norm()) < TOL:
        equals = "zero"
    else:
        equals = "none"
    return Verdict(equals, err_rev, err_fwd)


def certify(setting: Setting) -> dict[str, Verdict]:
    """The verdict of `setting` in every regime (a few ms per regime)."""
    out = {}
    for regime in REGIMES:
        p = problem(regime)
        out[regime] = judge(expected_gradient(setting, p), target_gradients(p))
    return out


# --- the docs' tables (tools/gen_docs.py: kl-certificate-*) ------------------------------------

_SHORT = {"reverse_kl": "reverse KL", "forward_kl": "forward KL", "zero": "zero",
          "none": "biased"}


def verdict_cell(v: Verdict) -> str:
    """What a regime's gradient equals and, unless it is the reverse KL's, its bias: the
    relative error to the reverse-KL gradient."""
    if v.equals == "reverse_kl":
        return "**reverse KL**"
    return f"{_SHORT[v.equals]} ({v.rel_error_reverse:.2g})"


def table_row(setting: Setting) -> list[str]:
    """One row's four regime cells, in REGIMES order."""
    return [verdict_cell(v) for v in certify(setting).values()]


INGREDIENT_ROWS = (("loss", "none"), ("loss", "ratio"), ("loss", "ratio_detached"),
                   ("loss", "score"), ("reward", "none"), ("reward_token", "none"))


def ingredient_settings() -> list[Setting]:
    """Every registered estimator in the loss (each weight) and in the reward."""
    return [ingredients(est, placement, weight)
            for est in ESTIMATORS for placement, weight in INGREDIENT_ROWS]


# --- the command line --------------------------------------------------------------------------


def verdict_text(title: str, verdicts: dict[str, Verdict]) -> str:
    names = {"reverse_kl": "the reverse-KL gradient grad KL(pi||ref)",
             "forward_kl": "the forward-KL gradient grad KL(ref||pi)",
             "zero": "zero: the KL term has no effect on the expected update",
             "none": "neither KL gradient (biased)"}
    lines = [title]
    for regime, v in verdicts.items():
        lines.append(f"  {regime:<20} {names[v.equals]}; relative error to reverse "
                     f"{v.rel_error_reverse:.3g}, to forward {v.rel_error_forward:.3g}")
    lines.append(f"(exact float64 enumeration; equal means relative error < {TOL:g}; "
                 "see `python -m algorithms.certify --help`)")
    return "\n".join(lines)


# Exit codes: 0 certified, 2 bad input (an unknown option, a value the framework's parser
# refuses, a non-finite coefficient), 3 a setting the framework accepts but then rejects
# where it computes the KL (verl's "+" estimators): there is no gradient to certify.
PEER_REJECTS_EXIT = 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m algorithms.certify", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Framework options are key=value (a bare flag means true); "
               "--framework NAME --list shows a framework's options.")
    parser.add_argument("--framework", help="a peer framework (algorithms/peers.py)")
    parser.add_argument("--estimator", help=f"one of {ESTIMATORS.names()}")
    parser.add_argument("--placement", default="loss", help=f"one of {PLACEMENTS.names()}")
    parser.add_argument("--weight", default="none", help=f"one of {WEIGHTS.names()}")
    parser.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    parser.add_argument("--list", action="store_true", help="list the framework's options")
    args, options = parser.parse_known_args(argv)
    from .peers import PEERS  # the registry imports this module's Term

    try:
        if args.framework is not None:
            if args.estimator is not None:
                raise ValueError("give either --framework with its options or --estimator "
                                 "(with --placement, --weight), not both")
            peer = PEERS.get(args.framework)
            if args.list:
                print(peer.options_text())
                return 0
            chosen = peer.parse(options)
            refusal = peer.refusal(chosen)
            if refusal is not None:  # the framework itself raises: nothing to certify
                if args.json:
                    print(json.dumps({"framework": peer.name, "peer_accepts": False,
                                      "peer_refusal": refusal}, indent=2))
                print(f"certify: {refusal}", file=sys.stderr)
                return PEER_REJECTS_EXIT
            setting = peer.resolve(chosen)
            title = (f"{peer.name} {peer.version} ({peer.commit[:10]}) "
                     f"{' '.join(f'{k}={v}' for k, v in chosen.items())}: {describe(setting)}")
        else:
            if options:
                raise ValueError(f"unrecognised arguments {options}; framework options need "
                                 f"--framework (one of {PEERS.names()})")
            if args.estimator is None:
                raise ValueError(f"give --framework (one of {PEERS.names()}) or --estimator "
                                 f"(one of {ESTIMATORS.names()})")
            setting = ingredients(args.estimator, args.placement, args.weight)
            title = describe(setting)
    except ValueError as exc:
        print(f"certify: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # tiny tensors: extra threads only add synchronisation cost
    verdicts = certify(setting)
    if args.json:
        out = {k: v.as_dict() for k, v in verdicts.items()}
        if args.framework is not None:  # the framework runs it: its verdicts, labelled
            out = {"framework": args.framework, "peer_accepts": True, "verdicts": out}
        print(json.dumps(out, indent=2))
    else:
        print(verdict_text(title, verdicts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
