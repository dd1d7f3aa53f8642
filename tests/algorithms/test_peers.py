"""The peer registry (algorithms/peers.py): every row's mapping to KL terms and its
certificate's verdict pinned, option parsing, and what a framework refuses.

EXPECTED is written from reading each framework's source at the pinned commit (the mapping)
and from the identities in tests/algorithms/test_certify.py (the verdicts); a row that is
added, removed or remapped fails here until this table is updated too.
"""

from __future__ import annotations

import re

import pytest

from algorithms.certify import Term, certify
from algorithms.peers import PEERS

R, F, Z, N = "reverse_kl", "forward_kl", "zero", "none"
LOSS_K3 = (F, N, N, N)  # on-policy token: forward KL; biased elsewhere
LOSS_K2 = (R, N, N, N)  # per token on-policy only
PER_TOKEN = LOSS_K2  # own-token reward k1, score-weighted k1/k3: each token's l grad log pi
LOSS_K1 = (Z, N, Z, N)  # E_pi[grad log pi] = 0 on-policy, per token and per sequence
RATIO = (R, R, N, N)  # unbiased value x differentiated ratio: per token, on and off
REWARD_K1 = (R, N, R, N)  # cost-to-go REINFORCE: exact on-policy, penalty frozen at pi_old
OTHER = (N, N, N, N)
REJECTED = None  # the framework raises where it computes the KL: nothing to certify

EXPECTED = {
    ("verl", "GRPO default: use_kl_loss, low_var_kl"): ((Term("low_var_kl", "loss"),), LOSS_K3),
    ("verl", "use_kl_loss, kl (k1)"): ((Term("k1", "loss"),), LOSS_K1),
    ("verl", "use_kl_loss, mse (k2)"): ((Term("k2", "loss"),), LOSS_K2),
    ("verl", "use_kl_loss, abs"): ((Term("abs", "loss"),), OTHER),
    ("verl", "use_kl_loss, low_var_kl+"): REJECTED,  # NotImplementedError in verl itself
    ("verl", "use_kl_loss, k1+"): REJECTED,
    ("verl", "use_kl_in_reward, kl (k1)"): ((Term("k1", "reward"),), REWARD_K1),
    ("verl", "use_kl_in_reward, low_var_kl"): ((Term("low_var_kl", "reward"),), OTHER),
    ("verl", "both: low_var_kl in loss, kl in reward"): (
        (Term("low_var_kl", "loss"), Term("k1", "reward")), OTHER),
    ("trl", "beta=0.04"): ((Term("k3", "loss"),), LOSS_K3),
    ("trl", "beta=0.04, use_bias_correction_kl"): ((Term("k3", "loss", "ratio"),), RATIO),
    ("openrlhf", "default: k1 in reward"): ((Term("k1", "reward"),), REWARD_K1),
    ("openrlhf", "use_loss, k3"): ((Term("k3", "loss"),), LOSS_K3),
    ("openrlhf", "use_loss, k2"): ((Term("k2", "loss"),), LOSS_K2),
    ("openrlhf", "use_loss, k1"): ((Term("k1", "loss"),), LOSS_K1),
    ("slime", "use_kl_loss, low_var_kl"): ((Term("low_var_kl", "loss"),), LOSS_K3),
    ("slime", "use_kl_loss, low_var_kl, use_unbiased_kl"): (
        (Term("low_var_kl", "loss", "ratio"),), RATIO),
    ("slime", "use_kl_loss, k1, use_unbiased_kl"): ((Term("k1", "loss", "ratio"),), RATIO),
    ("slime", "use_kl_loss, k2"): ((Term("k2", "loss"),), LOSS_K2),
    ("slime", "kl_coef with grpo (dropped)"): ((), (Z, Z, Z, Z)),
    ("slime", "kl_coef, k1, reinforce_plus_plus"): ((Term("k1", "reward"),), REWARD_K1),
    ("slime", "kl_coef, k1, reinforce_plus_plus_baseline"): (
        (Term("k1", "reward_token"),), PER_TOKEN),
    ("nemo-rl", "default: k3, exp(logp - SG(logp))"): (
        (Term("low_var_kl", "loss", "score"),), PER_TOKEN),
    ("nemo-rl", "use_on_policy_kl_approximation"): (
        (Term("low_var_kl", "loss", "ratio"),), RATIO),
    ("nemo-rl", "k1"): ((Term("k1", "loss", "score"),), PER_TOKEN),
    ("nemo-rl", "use_kl_in_reward with grpo (dropped)"): ((), (Z, Z, Z, Z)),
    ("nemo-rl", "use_kl_in_reward, k1, reinforce_plus_plus"): (
        (Term("k1", "reward_token"),), PER_TOKEN),
    ("skyrl", "default: use_kl_loss, k3"): ((Term("low_var_kl", "loss"),), LOSS_K3),
    ("skyrl", "use_kl_loss, k2"): ((Term("k2", "loss"),), LOSS_K2),
    ("skyrl", "use_kl_in_reward, k1"): ((Term("k1", "reward"),), REWARD_K1),
}

ROWS = [(peer.name, label, options) for peer in PEERS.values() for label, options in peer.rows]


def test_every_row_is_pinned():
    assert sorted((name, label) for name, label, _ in ROWS) == sorted(EXPECTED)


@pytest.mark.parametrize("name,label,options", ROWS, ids=[f"{n}: {lab}" for n, lab, _ in ROWS])
def test_row_mapping_and_verdict(name, label, options):
    if EXPECTED[(name, label)] is REJECTED:
        assert PEERS[name].refusal(options) is not None
        with pytest.raises(ValueError, match="NotImplementedError"):
            PEERS[name].resolve(options)
        return
    assert PEERS[name].refusal(options) is None
    terms, verdict = EXPECTED[(name, label)]
    setting = PEERS[name].resolve(options)
    assert setting == terms
    assert tuple(v.equals for v in certify(setting).values()) == verdict


@pytest.mark.parametrize("name", list(PEERS))
def test_each_framework_is_pinned_to_a_commit_and_its_files(name):
    peer = PEERS[name]
    assert re.fullmatch(r"[0-9a-f]{40}", peer.commit)
    assert peer.version and peer.sources and peer.rows and peer.advice
    for option in peer.options.values():  # every default is itself accepted
        option.check("key", option.default)


def test_verl_spellings():
    verl = PEERS["verl"]
    for alias, estimator in (("kl", "k1"), ("mse", "k2"), ("k3", "low_var_kl")):
        setting = verl.resolve(verl.parse(["use_kl_loss=true", f"kl_loss_type={alias}"]))
        assert setting == (Term(estimator, "loss"),)
    assert verl.resolve(verl.parse([])) == ()  # neither placement on by default


@pytest.mark.parametrize("name", ["k1+", "kl+", "abs+", "low_var_kl+", "k3+", "k2+", "mse+",
                                  "full"])
@pytest.mark.parametrize("switch,key", [("use_kl_loss", "kl_loss_type"),
                                        ("use_kl_in_reward", "kl_penalty")])
def test_verl_rejects_every_plus_estimator_and_full_where_it_computes_the_kl(name, switch, key):
    """At b178a3c kl_penalty hands the suffixed name to kl_penalty_forward, which raises
    NotImplementedError (core_algos.py:1902; "full": 1900): verl's config takes the name,
    the run fails. An unused option (its placement off) is not a refusal."""
    verl = PEERS["verl"]
    line = 1900 if name == "full" else 1902
    assert verl.refusal(verl.parse([f"{switch}=true", f"{key}={name}"])) == (
        f"verl b178a3c rejects {key}={name}: kl_penalty_forward raises NotImplementedError, "
        f"verl/trainer/ppo/core_algos.py:{line}")
    assert verl.refusal(verl.parse([f"{key}={name}"])) is None


def test_values_are_read_as_each_framework_reads_them():
    """Named values exactly (argparse's choices are case-sensitive: OpenRLHF refuses K1),
    booleans in any case, coefficients finite and >= 0."""
    openrlhf, trl = PEERS["openrlhf"], PEERS["trl"]
    with pytest.raises(ValueError, match="algo.kl.estimator='K1' is not accepted"):
        openrlhf.parse(["algo.kl.estimator=K1"])
    assert trl.parse(["use_bias_correction_kl=True"])["use_bias_correction_kl"] == "true"
    for bad in ("nan", "inf", "-0.1", "x"):
        with pytest.raises(ValueError, match=f"beta='{bad}' is not accepted; give a finite "):
            trl.parse([f"beta={bad}"])


def test_parse_reads_flags_dashes_and_defaults():
    slime = PEERS["slime"]
    chosen = slime.parse(["--use-kl-loss", "--kl-loss-coef=0.01", "--use-unbiased-kl",
                          "--kl-loss-type=k3"])
    assert chosen["use_kl_loss"] == "true" and chosen["kl_loss_type"] == "k3"
    assert chosen["advantage_estimator"] == "grpo"  # default filled in
    assert slime.resolve(chosen) == (Term("k3", "loss", "ratio"),)


def test_trl_beta_zero_has_no_kl_term():
    trl = PEERS["trl"]
    assert trl.resolve(trl.parse(["use_bias_correction_kl=true"])) == ()
    assert trl.resolve(trl.parse(["beta=0.001"])) == (Term("k3", "loss"),)


def test_openrlhf_zero_coefficient_has_no_kl_term():
    openrlhf = PEERS["openrlhf"]
    assert openrlhf.resolve(openrlhf.parse(["algo.kl.init_coef=0"])) == ()


@pytest.mark.parametrize("peer,tokens,message", [
    ("verl", ["bogus=1"], "verl has no KL option 'bogus'; its options: ['use_kl_loss'"),
    ("trl", ["beta=-1"], "beta='-1' is not accepted; give a finite number >= 0"),
    ("trl", ["beta"], "trl option 'beta' needs a value: beta=VALUE"),
    ("slime", ["advantage_estimator=ppo"], "choose one of ['grpo', 'gspo', 'cispo', "
                                           "'reinforce_plus_plus', "
                                           "'reinforce_plus_plus_baseline']"),
    ("openrlhf", ["algo.kl.estimator=k4"], "choose one of ['k1', 'k2', 'k3']"),
])
def test_bad_options_name_what_is_accepted(peer, tokens, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        PEERS[peer].parse(tokens)


def test_slime_refuses_both_coefficients():
    slime = PEERS["slime"]
    with pytest.raises(ValueError, match="kl_coef and kl_loss_coef both nonzero"):
        slime.resolve(slime.parse(["kl_coef=0.1", "kl_loss_coef=0.1"]))


def test_nemo_rl_k3_is_clamped_and_in_reward_needs_reinforce_plus_plus():
    nemo = PEERS["nemo-rl"]
    assert nemo.resolve(nemo.parse([])) == (Term("low_var_kl", "loss", "score"),)
    assert nemo.resolve(nemo.parse(["reference_policy_kl_penalty=0"])) == ()
    for name in ("grpo", "gdpo"):
        assert nemo.resolve(nemo.parse(["use_kl_in_reward=true",
                                        f"adv_estimator.name={name}"])) == ()


def test_skyrl_refuses_both_placements():
    skyrl = PEERS["skyrl"]
    with pytest.raises(ValueError, match="use_kl_loss and use_kl_in_reward both true"):
        skyrl.resolve(skyrl.parse(["use_kl_in_reward=true"]))  # use_kl_loss defaults to true


def test_the_peer_kl_sweep_trains_the_peers_loss_terms():
    """config/ablations/peer-kl.yaml trains, beside an RPG method, the loss term of verl's
    default, TRL's default and bias-corrected k3, slime's unbiased low_var_kl and NeMo-RL's
    default: each such row's term is some cell's resolved LossConfig."""
    from pathlib import Path

    import yaml

    from algorithms.certify import WEIGHTS
    from sweep import expand, parse_sweep
    from sweep.runconfig import run_config
    from trainer.config import parse_run_config

    path = Path(__file__).resolve().parents[2] / "config/ablations/peer-kl.yaml"
    data = yaml.safe_load(path.read_text())
    spec = parse_sweep({**data, "eval": {"steps": [2], "benchmarks": ["toy"]}}, str(path))
    cells, _ = expand(spec)
    trained = set()
    for cell in cells:
        loss = parse_run_config(run_config(spec, cell), cell.run_id).resolved_method().loss
        trained.add((loss.objective, loss.estimator, loss.kl_placement, loss.kl_importance_weight))
    assert ("rpg", None, "exact", "none") in trained
    for name, label in (("verl", "GRPO default: use_kl_loss, low_var_kl"), ("trl", "beta=0.04"),
                        ("trl", "beta=0.04, use_bias_correction_kl"),
                        ("slime", "use_kl_loss, low_var_kl, use_unbiased_kl"),
                        ("nemo-rl", "default: k3, exp(logp - SG(logp))")):
        (term,) = PEERS[name].resolve(dict(PEERS[name].rows)[label])
        assert ("ppo", term.estimator, term.placement, WEIGHTS[term.weight]) in trained, label
