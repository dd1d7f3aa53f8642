"""The three-policy audit (mu != pi_old): `sampler` is exact to float64 precision; the
sequence modes are exact where they cut nothing; the rest show their bias."""

import pytest
import torch

from algorithms.audit import SAMPLER_SCENARIOS, TREE, make_sampler_problem, run_correction_audit

CAP = 2.0


@pytest.fixture(scope="module")
def audit():
    return run_correction_audit(cap=CAP, divergences=("urkl", "fkl")).set_index(
        ["loss", "mode", "scenario"])["rel_bias"]


def cuts_a_sequence(scenario: str) -> bool:
    """Whether some sequence's ratio pi_old/mu of the scenario leaves [1/cap, cap]."""
    p = make_sampler_problem(TREE, scenario)
    log_r = (TREE.token_logps(p.theta_old) - TREE.token_logps(p.theta_mu)).sum(-1)
    return bool((log_r.abs() > torch.log(torch.tensor(CAP, dtype=log_r.dtype))).any())


def test_the_sampler_differs_from_pi_old_in_every_scenario():
    for scenario in SAMPLER_SCENARIOS:
        p = make_sampler_problem(TREE, scenario)
        assert float((p.theta_mu - p.theta_old).abs().max()) > 0.01, scenario


def test_sampler_mode_is_exact(audit):
    assert float(audit.xs("sampler", level="mode").max()) < 1e-12


def test_no_correction_is_biased_and_more_so_for_a_larger_mismatch(audit):
    none = audit.xs("none", level="mode")
    assert float(none.min()) > 1e-2
    for loss in none.index.get_level_values("loss").unique():
        sizes = [none[(loss, sc)] for sc in SAMPLER_SCENARIOS if sc.startswith("mismatch")]
        assert sizes == sorted(sizes), loss


@pytest.mark.parametrize("mode", ["seq_tis", "seq_mis"])
def test_sequence_modes_are_exact_exactly_where_they_cut_nothing(audit, mode):
    rows = audit.xs(mode, level="mode")
    assert any(cuts_a_sequence(sc) for sc in SAMPLER_SCENARIOS)  # both cases are covered
    assert not all(cuts_a_sequence(sc) for sc in SAMPLER_SCENARIOS)
    for (loss, scenario), bias in rows.items():
        if cuts_a_sequence(scenario):
            assert bias > 1e-3, (loss, scenario)
        else:
            assert bias < 1e-12, (loss, scenario)


@pytest.mark.parametrize("mode", ["token_tis", "token_mis"])
def test_token_modes_are_biased_on_sequences_but_less_than_none(audit, mode):
    """A per-token pi_old/mu is not the sequence's importance weight: biased everywhere."""
    rows, none = audit.xs(mode, level="mode"), audit.xs("none", level="mode")
    assert float(rows.min()) > 1e-3
    small = [(loss, sc) for loss, sc in rows.index if sc == SAMPLER_SCENARIOS[0]]
    assert all(rows[k] < none[k] for k in small)
