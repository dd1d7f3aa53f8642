"""The KL settings of peer RL frameworks, mapped to the certificate's ingredients.

Each framework is read from its source at one commit (`Peer.commit`, `Peer.sources`), never
copied: its KL-related options, their accepted values and defaults, and `resolve`, which
turns a choice of values into the KL terms (`algorithms.certify.Term`) its trainer adds.
`Peer.rows` are the settings the docs table certifies (docs/kl-certificate.md); each is pinned
by tests/algorithms/test_peers.py. Re-read the sources and update a row when a framework
changes what an option computes.

Mapping notes common to all: a clamp on an estimator's value ([-10, 10] in OpenRLHF, slime's
low_var_kl, verl's low_var_kl) is inactive where the certificate enumerates, so an estimator
is mapped to the unclamped one unless the framework names it low_var_kl; a KL in the reward
is computed from the rollout policy's log-probs and becomes a cost-to-go (or, equal in
expectation, the whole sequence's sum), except where a REINFORCE++ estimator leaves it on its
own token (NeMo-RL; slime's reinforce_plus_plus_baseline): placement "reward_token".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from .certify import Setting, Term
from .registry import Registry

BOOL = ("true", "false")


@dataclass(frozen=True)
class Option:
    """One KL-related option: the values the framework's own parser accepts (None: a finite
    number >= 0; BOOL: true or false in any case, as every peer's parser reads a boolean;
    named values exactly, case included, as argparse's `choices` and the peers' string
    comparisons read them) and its default."""

    default: str
    values: tuple[str, ...] | None = BOOL
    meaning: str = ""

    def check(self, key: str, value: str) -> str:
        if self.values is None:
            try:
                number = float(value)
            except ValueError:
                number = float("nan")
            if not (math.isfinite(number) and number >= 0):
                raise ValueError(f"{key}={value!r} is not accepted; give a finite number >= 0")
            return value
        if self.values == BOOL:
            if value.lower() not in BOOL:
                raise ValueError(f"{key}={value!r} is not accepted; choose true or false")
            return value.lower()
        if value not in self.values:
            raise ValueError(f"{key}={value!r} is not accepted; choose one of "
                             f"{list(self.values)}")
        return value


@dataclass(frozen=True)
class Peer:
    """A framework: where it was read, its options, and how a choice of them resolves."""

    name: str
    version: str  # the package version at `commit`
    commit: str  # the commit read
    sources: tuple[str, ...]  # the files read, relative to the repository root
    options: dict[str, Option]
    resolve_fn: Callable[[dict[str, str]], Setting]
    advice: str  # what to set for the reverse-KL gradient
    rows: tuple[tuple[str, dict[str, str]], ...] = field(default=())  # (label, options)
    # why the framework itself refuses a choice its parser takes (an error raised where the
    # option is used, at run time, file:line at `commit`), None when it runs
    refusal_fn: Callable[[dict[str, str]], str | None] = field(default=lambda chosen: None)

    def parse(self, tokens: list[str]) -> dict[str, str]:
        """`key=value` tokens (a bare `--flag` or `flag` means true; leading dashes dropped,
        '-' read as '_') -> every option's value, defaults filled in."""
        chosen: dict[str, str] = {}
        for token in tokens:
            key, sep, value = token.lstrip("-").partition("=")
            key = key.replace("-", "_")
            if key not in self.options:
                raise ValueError(f"{self.name} has no KL option {key!r}; its options: "
                                 f"{list(self.options)}")
            if not sep and self.options[key].values != BOOL:
                raise ValueError(f"{self.name} option {key!r} needs a value: {key}=VALUE")
            chosen[key] = self.options[key].check(key, value if sep else "true")
        return {k: chosen.get(k, o.default) for k, o in self.options.items()}

    def resolve(self, chosen: dict[str, str]) -> Setting:
        return self.resolve_fn({k: chosen.get(k, o.default) for k, o in self.options.items()})

    def refusal(self, chosen: dict[str, str]) -> str | None:
        """One line when the framework rejects this choice ("verl b178a3c rejects
        kl_loss_type=k3+: ..."), None when it runs it."""
        why = self.refusal_fn({k: chosen.get(k, o.default) for k, o in self.options.items()})
        return None if why is None else f"{self.name} {self.commit[:7]} rejects {why}"

    def options_text(self) -> str:
        lines = [f"{self.name} {self.version} at {self.commit} ({', '.join(self.sources)}):"]
        for key, o in self.options.items():
            values = "a number >= 0" if o.values is None else "|".join(o.values)
            lines.append(f"  {key}={values} (default {o.default}): {o.meaning}")
        return "\n".join(lines)


PEERS: Registry[Peer] = Registry("framework")


def _on(value: str) -> bool:
    return value == "true"


def _positive(value: str) -> bool:
    return float(value) > 0


# --- verl -------------------------------------------------------------------------------------
# core_algos.kl_penalty: kl/k1 -> k1, abs, mse/k2 -> k2, low_var_kl/k3 -> clamped k3. A "+"
# suffix was meant to keep the value and take k2's gradient (straight-through), but at the
# pinned commit kl_penalty passes the suffixed name to kl_penalty_forward (line 1853), which
# matches no branch and raises NotImplementedError (line 1902; "full" at 1900): every "+"
# name, like "full", fails where verl computes the KL (since b8dc5377c, August 2025). verl's
# config takes any string, so these are accepted here and reported as rejected (exit 3).
_VERL_KL = {"kl": "k1", "k1": "k1", "abs": "abs", "mse": "k2", "k2": "k2",
            "low_var_kl": "low_var_kl", "k3": "low_var_kl", "kl+": "k1+", "k1+": "k1+",
            "abs+": "abs+", "low_var_kl+": "low_var_kl+", "k3+": "low_var_kl+", "k2+": "k2",
            "mse+": "k2", "full": None}
_VERL_RAISES = "verl/trainer/ppo/core_algos.py"


def _verl_refusal(o: dict[str, str]) -> str | None:
    for switch, key in (("use_kl_loss", "kl_loss_type"), ("use_kl_in_reward", "kl_penalty")):
        name = o[key]
        if _on(o[switch]) and (name.endswith("+") or name == "full"):
            line = 1900 if name == "full" else 1902
            return (f"{key}={name}: kl_penalty_forward raises NotImplementedError, "
                    f"{_VERL_RAISES}:{line}")
    return None


def _verl(o: dict[str, str]) -> Setting:
    # dp_actor / megatron_actor: policy_loss + kl_loss_coef * agg(kl_penalty(logp, ref)), no
    # weight; ray_trainer.apply_kl_penalty: token_level_rewards = scores - beta * kl_penalty(
    # old_log_probs, ref) (both placements may be on at once).
    if _verl_refusal(o) is not None:
        raise ValueError(_verl_refusal(o))  # nothing to certify: verl raises there
    terms = []
    if _on(o["use_kl_loss"]):
        terms.append(Term(_VERL_KL[o["kl_loss_type"]], "loss"))
    if _on(o["use_kl_in_reward"]):
        terms.append(Term(_VERL_KL[o["kl_penalty"]], "reward"))
    return tuple(terms)


PEERS.register("verl", Peer(
    name="verl", version="0.8.0.dev", commit="b178a3cd56f58b2d502255daba591e92833930a7",
    sources=("verl/trainer/ppo/core_algos.py", "verl/workers/actor/dp_actor.py",
             "verl/trainer/ppo/ray_trainer.py", "verl/trainer/config/actor/actor.yaml",
             "verl/trainer/config/algorithm.py"),
    options={
        "use_kl_loss": Option("false", meaning="actor.use_kl_loss: KL term in the loss"),
        "kl_loss_type": Option("low_var_kl", tuple(_VERL_KL),
                               "actor.kl_loss_type: the loss term's estimator"),
        "use_kl_in_reward": Option("false", meaning="algorithm.use_kl_in_reward: KL in the "
                                   "token-level reward"),
        "kl_penalty": Option("kl", tuple(_VERL_KL), "algorithm.kl_penalty: the reward's "
                             "estimator"),
    },
    resolve_fn=_verl,
    refusal_fn=_verl_refusal,
    advice="use_kl_in_reward=true with kl_penalty=kl (k1) is the only verl setting whose "
           "expected gradient is the sequence reverse-KL gradient (on-policy); in the loss, "
           "kl_loss_type=mse gives it per token, on-policy only, and the default low_var_kl "
           "gives the forward KL's. The \"+\" variants (k3+, low_var_kl+, k1+, ...) would give "
           "k2's gradient, but verl at this commit rejects them: kl_penalty_forward raises "
           "NotImplementedError (core_algos.py:1902).",
    rows=(
        ("GRPO default: use_kl_loss, low_var_kl", {"use_kl_loss": "true"}),
        ("use_kl_loss, kl (k1)", {"use_kl_loss": "true", "kl_loss_type": "kl"}),
        ("use_kl_loss, mse (k2)", {"use_kl_loss": "true", "kl_loss_type": "mse"}),
        ("use_kl_loss, abs", {"use_kl_loss": "true", "kl_loss_type": "abs"}),
        ("use_kl_loss, low_var_kl+", {"use_kl_loss": "true", "kl_loss_type": "low_var_kl+"}),
        ("use_kl_loss, k1+", {"use_kl_loss": "true", "kl_loss_type": "k1+"}),
        ("use_kl_in_reward, kl (k1)", {"use_kl_in_reward": "true"}),
        ("use_kl_in_reward, low_var_kl", {"use_kl_in_reward": "true",
                                          "kl_penalty": "low_var_kl"}),
        ("both: low_var_kl in loss, kl in reward", {"use_kl_loss": "true",
                                                   "use_kl_in_reward": "true"}),
    ),
))


# --- TRL -------------------------------------------------------------------------------------


def _trl(o: dict[str, str]) -> Setting:
    # GRPOTrainer._compute_loss: per_token_kl = exp(ref - logp) - (ref - logp) - 1 (k3, no
    # clamp), times coef_1 = exp(logp - old_logp) (not detached) when use_bias_correction_kl;
    # added to the per-token loss with beta. beta = 0 loads no reference: no KL term.
    if not _positive(o["beta"]):
        return ()
    return (Term("k3", "loss", "ratio" if _on(o["use_bias_correction_kl"]) else "none"),)


PEERS.register("trl", Peer(
    name="trl", version="1.10.0.dev0", commit="f2cd57710ae345ea6428ae95363267fcf38a3dc8",
    sources=("trl/trainer/grpo_trainer.py", "trl/trainer/grpo_config.py"),
    options={
        "beta": Option("0.0", None, "GRPOConfig.beta: KL coefficient (0: no KL, no reference)"),
        "use_bias_correction_kl": Option("false", meaning="GRPOConfig.use_bias_correction_kl: "
                                         "k3 times the token ratio pi/pi_old, differentiated"),
    },
    resolve_fn=_trl,
    advice="use_bias_correction_kl=true (with beta > 0) gives the reverse-KL gradient per "
           "token, on- and off-policy; no GRPOTrainer setting gives the sequence-level one. Rows "
           "assume importance_sampling_level=token (the default).",
    rows=(
        ("beta=0.04", {"beta": "0.04"}),
        ("beta=0.04, use_bias_correction_kl", {"beta": "0.04",
                                               "use_bias_correction_kl": "true"}),
    ),
))


# --- OpenRLHF ---------------------------------------------------------------------------------


def _openrlhf(o: dict[str, str]) -> Setting:
    # ppo_actor: with algo.kl.use_loss, actor_loss + kl_ctl * agg(compute_approx_kl(logp, ref,
    # estimator)), no weight; without it, experience_maker puts -init_coef * kl (rollout
    # log-probs) in the reward, and the default advantage estimator (gae with gamma = lambda = 1)
    # makes it a cost-to-go: the same expectation as a cumulative return.
    # compute_approx_kl clamps every estimator's value to [-10, 10]. No unbiased flag here.
    if not _positive(o["algo.kl.init_coef"]):
        return ()
    placement = "loss" if _on(o["algo.kl.use_loss"]) else "reward"
    return (Term(o["algo.kl.estimator"], placement),)


PEERS.register("openrlhf", Peer(
    name="openrlhf", version="0.11.0", commit="3c3be6234e0cb353e76bb8019947db9dfe99fca7",
    sources=("openrlhf/cli/train_ppo_ray.py", "openrlhf/models/utils.py",
             "openrlhf/trainer/ray/ppo_actor.py",
             "openrlhf/trainer/ppo_utils/experience_maker.py"),
    options={
        "algo.kl.use_loss": Option("false", meaning="--algo.kl.use_loss: KL in the loss "
                                   "instead of the reward"),
        "algo.kl.estimator": Option("k1", ("k1", "k2", "k3"), "--algo.kl.estimator"),
        "algo.kl.init_coef": Option("0.01", None, "--algo.kl.init_coef: KL coefficient"),
    },
    resolve_fn=_openrlhf,
    advice="the default (KL in the reward, algo.kl.estimator=k1) gives the sequence "
           "reverse-KL gradient on-policy; with algo.kl.use_loss, k2 gives it per token "
           "on-policy only, and k3 the forward KL's.",
    rows=(
        ("default: k1 in reward", {}),
        ("use_loss, k3", {"algo.kl.use_loss": "true", "algo.kl.estimator": "k3"}),
        ("use_loss, k2", {"algo.kl.use_loss": "true", "algo.kl.estimator": "k2"}),
        ("use_loss, k1", {"algo.kl.use_loss": "true"}),
    ),
))


# --- slime ------------------------------------------------------------------------------------
_SLIME_KL = {"k1": "k1", "k2": "k2", "k3": "k3", "low_var_kl": "low_var_kl"}
_SLIME_REWARD_KL = {"reinforce_plus_plus": "reward",  # returns: -kl_coef * kl summed to go
                    "reinforce_plus_plus_baseline": "reward_token"}  # each token's own -kl
_SLIME_DROPS_KL = ("grpo", "gspo", "cispo")  # get_grpo_returns keeps the reward only


def _slime(o: dict[str, str]) -> Setting:
    # megatron_utils/loss.py policy_loss_function: with --use-kl-loss, loss + kl_loss_coef *
    # compute_approx_kl(logp, ref, kl_loss_type, importance_ratio), the ratio exp(logp -
    # old_logp) (not detached) under --use-unbiased-kl. compute_advantages_and_returns puts
    # --kl-coef * kl (rollout log-probs) in the reward for the reinforce_plus_plus estimators
    # only; the grpo/gspo/cispo estimators drop it (slime#397).
    if _positive(o["kl_coef"]) and _positive(o["kl_loss_coef"]):
        raise ValueError("slime refuses kl_coef and kl_loss_coef both nonzero (arguments.py "
                         "asserts only one is set); set one of them to 0")
    terms = []
    if _on(o["use_kl_loss"]) and _positive(o["kl_loss_coef"]):
        weight = "ratio" if _on(o["use_unbiased_kl"]) else "none"
        terms.append(Term(_SLIME_KL[o["kl_loss_type"]], "loss", weight))
    if _positive(o["kl_coef"]) and o["advantage_estimator"] in _SLIME_REWARD_KL:
        terms.append(Term(_SLIME_KL[o["kl_loss_type"]],
                          _SLIME_REWARD_KL[o["advantage_estimator"]]))
    return tuple(terms)


PEERS.register("slime", Peer(
    name="slime", version="0.3.1", commit="624b824a898ab0ec1fcb4d373004c7f3852bf515",
    sources=("slime/utils/arguments.py", "slime/utils/ppo_utils.py",
             "slime/backends/megatron_utils/loss.py"),
    options={
        "use_kl_loss": Option("false", meaning="--use-kl-loss: KL term in the loss"),
        "kl_loss_coef": Option("0.0", None, "--kl-loss-coef: the loss term's coefficient"),
        "kl_loss_type": Option("k1", tuple(_SLIME_KL), "--kl-loss-type: the estimator, in "
                               "the loss and in the reward"),
        "use_unbiased_kl": Option("false", meaning="--use-unbiased-kl: the loss term times "
                                  "pi/pi_old, differentiated"),
        "kl_coef": Option("0.0", None, "--kl-coef: KL in the reward (slime refuses it with "
                          "kl_loss_coef != 0)"),
        "advantage_estimator": Option("grpo", _SLIME_DROPS_KL + tuple(_SLIME_REWARD_KL),
                                      "--advantage-estimator (ppo, with a critic, is not "
                                      "modelled)"),
    },
    resolve_fn=_slime,
    advice="--use-kl-loss with --use-unbiased-kl (k1, k3 or low_var_kl) gives the reverse-KL "
           "gradient per token, on- and off-policy; --kl-coef with "
           "--advantage-estimator reinforce_plus_plus and --kl-loss-type k1 gives the "
           "sequence one on-policy; with grpo, gspo or cispo --kl-coef is silently dropped.",
    rows=(
        ("use_kl_loss, low_var_kl", {"use_kl_loss": "true", "kl_loss_coef": "0.01",
                                     "kl_loss_type": "low_var_kl"}),
        ("use_kl_loss, low_var_kl, use_unbiased_kl", {
            "use_kl_loss": "true", "kl_loss_coef": "0.01", "kl_loss_type": "low_var_kl",
            "use_unbiased_kl": "true"}),
        ("use_kl_loss, k1, use_unbiased_kl", {"use_kl_loss": "true", "kl_loss_coef": "0.01",
                                              "use_unbiased_kl": "true"}),
        ("use_kl_loss, k2", {"use_kl_loss": "true", "kl_loss_coef": "0.01",
                             "kl_loss_type": "k2"}),
        ("kl_coef with grpo (dropped)", {"kl_coef": "0.01"}),
        ("kl_coef, k1, reinforce_plus_plus", {"kl_coef": "0.01",
                                             "advantage_estimator": "reinforce_plus_plus"}),
        ("kl_coef, k1, reinforce_plus_plus_baseline", {
            "kl_coef": "0.01", "advantage_estimator": "reinforce_plus_plus_baseline"}),
    ),
))


# --- NeMo-RL ----------------------------------------------------------------------------------
# algorithms/utils.calculate_kl clamps log r to [-20, 20] and the value to [-10, 10] for every
# type: its k3 is verl's low_var_kl.
_NEMO_KL = {"k1": "k1", "k2": "k2", "k3": "low_var_kl"}


def _nemo_rl(o: dict[str, str]) -> Setting:
    # loss/loss_functions.py ClippedPGLossFn: penalty * calculate_kl(curr, ref, weights) with
    # weights exp(curr - SG(curr)) (value 1: "score"), or exp(curr - generation logprobs)
    # (the ratio to the sampler, differentiated) under use_on_policy_kl_approximation. With
    # use_kl_in_reward the loss penalty is set to 0 and only the reinforce_plus_plus estimator
    # (advantage_estimator.py) puts -penalty * kl on each token's own advantage; grpo and gdpo
    # ignore it, so the KL is gone.
    if not _positive(o["reference_policy_kl_penalty"]):
        return ()
    estimator = _NEMO_KL[o["reference_policy_kl_type"]]
    if _on(o["use_kl_in_reward"]):
        if o["adv_estimator.name"] == "reinforce_plus_plus":
            return (Term(estimator, "reward_token"),)
        return ()
    weight = "ratio" if _on(o["use_on_policy_kl_approximation"]) else "score"
    return (Term(estimator, "loss", weight),)


PEERS.register("nemo-rl", Peer(
    name="nemo-rl", version="0.6.0", commit="7ea279abfbeb698b092856d0dab61e7cf39bc909",
    sources=("nemo_rl/algorithms/loss/loss_functions.py", "nemo_rl/algorithms/utils.py",
             "nemo_rl/algorithms/advantage_estimator.py", "nemo_rl/algorithms/grpo.py"),
    options={
        "reference_policy_kl_penalty": Option("0.01", None, "loss_fn.reference_policy_kl_"
                                              "penalty: KL coefficient"),
        "reference_policy_kl_type": Option("k3", tuple(_NEMO_KL),
                                           "loss_fn.reference_policy_kl_type"),
        "use_on_policy_kl_approximation": Option(
            "false", meaning="loss_fn.use_on_policy_kl_approximation: weight the loss term "
            "by pi/pi_gen (differentiated) instead of exp(logp - SG(logp))"),
        "use_kl_in_reward": Option("false", meaning="loss_fn.use_kl_in_reward: the KL in "
                                   "the reward, not the loss"),
        "adv_estimator.name": Option("grpo", ("grpo", "gdpo", "reinforce_plus_plus"),
                                     "grpo.adv_estimator.name"),
    },
    resolve_fn=_nemo_rl,
    advice="the default (k3 times exp(logp - SG(logp))) is the reverse-KL gradient per token "
           "on-policy only; use_on_policy_kl_approximation=true makes it exact off-policy "
           "too; none of the settings modelled here (the grpo, gdpo and reinforce_plus_plus "
           "estimators; GAE with a critic is not) gives the sequence-level one, and "
           "use_kl_in_reward with the grpo or gdpo estimator silently drops the KL.",
    rows=(
        ("default: k3, exp(logp - SG(logp))", {}),
        ("use_on_policy_kl_approximation", {"use_on_policy_kl_approximation": "true"}),
        ("k1", {"reference_policy_kl_type": "k1"}),
        ("use_kl_in_reward with grpo (dropped)", {"use_kl_in_reward": "true"}),
        ("use_kl_in_reward, k1, reinforce_plus_plus", {
            "use_kl_in_reward": "true", "reference_policy_kl_type": "k1",
            "adv_estimator.name": "reinforce_plus_plus"}),
    ),
))


# --- SkyRL ------------------------------------------------------------------------------------
# ppo_utils.compute_approx_kl: k1, abs, k2, and k3 with verl's clamps (low_var_kl).
_SKYRL_KL = {"k1": "k1", "abs": "abs", "k2": "k2", "k3": "low_var_kl"}


def _skyrl(o: dict[str, str]) -> Setting:
    # workers/worker.py: policy_loss + kl_loss_coef * mean(compute_approx_kl(logp, ref)), no
    # weight; train/trainer.py apply_reward_kl_penalty: rewards - kl * kl_loss_coef per token
    # (rollout log-probs), which the default grpo estimator sums over the response (the same
    # expectation as a cost-to-go). utils.py asserts the two are not both on.
    if _on(o["use_kl_loss"]) and _on(o["use_kl_in_reward"]):
        raise ValueError("skyrl refuses use_kl_loss and use_kl_in_reward both true (they are "
                         "mutually exclusive); set one to false")
    if not _positive(o["kl_loss_coef"]):
        return ()
    estimator = _SKYRL_KL[o["kl_estimator_type"]]
    if _on(o["use_kl_loss"]):
        return (Term(estimator, "loss"),)
    if _on(o["use_kl_in_reward"]):
        return (Term(estimator, "reward"),)
    return ()


PEERS.register("skyrl", Peer(
    name="skyrl", version="0.3.0", commit="a9564572eb8e91076be43c1bd5e4615e3de17265",
    sources=("skyrl/train/config/config.py", "skyrl/backends/skyrl_train/utils/ppo_utils.py",
             "skyrl/backends/skyrl_train/workers/worker.py", "skyrl/train/trainer.py",
             "skyrl/train/utils/utils.py"),
    options={
        "use_kl_loss": Option("true", meaning="trainer.algorithm.use_kl_loss"),
        "use_kl_in_reward": Option("false", meaning="trainer.algorithm.use_kl_in_reward"),
        "kl_estimator_type": Option("k3", tuple(_SKYRL_KL),
                                    "trainer.algorithm.kl_estimator_type"),
        "kl_loss_coef": Option("0.001", None, "trainer.algorithm.kl_loss_coef (the reward "
                               "KL's initial coefficient too)"),
    },
    resolve_fn=_skyrl,
    advice="use_kl_loss=false use_kl_in_reward=true kl_estimator_type=k1 gives the sequence "
           "reverse-KL gradient on-policy; in the loss, k2 gives it per token on-policy only, "
           "and the default k3 the forward KL's.",
    rows=(
        ("default: use_kl_loss, k3", {}),
        ("use_kl_loss, k2", {"kl_estimator_type": "k2"}),
        ("use_kl_in_reward, k1", {"use_kl_loss": "false", "use_kl_in_reward": "true",
                                  "kl_estimator_type": "k1"}),
    ),
))
