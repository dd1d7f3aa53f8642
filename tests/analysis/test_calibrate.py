"""The harness checks its own intervals: on simulated studies where runs differ by 4 points,
the old bootstrap over (problem, seed) pairs separates 20% or more of null comparisons, the
report's paired t over seeds about 5% (at most 7%) at 3 and at 5 seeds; it still separates a
large real effect, and the planner's detectable Δ is detected about 80% of the time."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from analysis_fixtures import write_run

from analysis.__main__ import main
from analysis.calibrate import Model, beta_accuracies, calibrate, rate, render, sweep_model


@pytest.fixture(scope="module")
def calibration():
    q = beta_accuracies(0.25, 0.15, 121)
    return calibrate(Model(q, run_sd=0.04, interaction_sd=0.03, samples=4), seeds=(3, 5),
                     studies=1000, effect=0.30, old_studies=150, old_reps=500, seed=0)


def test_the_report_interval_holds_where_the_old_bootstrap_fails(calibration):
    for row in calibration.rows:
        assert row.old_rate[0] >= 0.20, row  # the problem-level bootstrap: anti-conservative
        assert row.false_rate[0] <= 0.07, row  # the run as the unit: calibrated
        assert row.power_at_effect[0] >= 0.9, row  # a 30-point effect still shows


def test_the_planners_detectable_difference_is_detected_about_80_percent(calibration):
    for row in calibration.rows:
        assert 0.72 <= row.power_at_mdd[0] <= 0.88, row
    three, five = calibration.rows
    assert five.mdd < three.mdd  # more seeds, a smaller detectable difference


def test_render_states_each_figure(calibration):
    text = render(calibration)
    assert "run-to-run sd 4.00 points" in text and "false separations" in text
    for row in calibration.rows:
        assert f"{100 * row.false_rate[0]:5.1f}%" in text and f"{100 * row.mdd:10.2f}" in text


def test_rate_gives_a_wilson_interval():
    share, low, high = rate(50, 1000)
    assert share == 0.05 and low < 0.05 < high and high - low == pytest.approx(0.0273, abs=1e-3)


def test_a_sweeps_components_define_the_model(tmp_path):
    # DAPO and M over 3 seeds; M's runs shift by seed: the fitted run sd is positive
    for label, means in {"DAPO": (0.25, 0.25, 0.25), "M": (0.45, 0.20, 0.30)}.items():
        for seed, mean in enumerate(means):
            write_run(tmp_path / "runs", f"{label}{seed}", label, seed, {},
                      evals={"toy": {5: mean}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = sweep_model(str(tmp_path), "dapo", "toy", "DAPO")
    assert model.problems == 5 and model.samples == 4 and model.run_sd > 0.05
    assert np.allclose(np.sort(model.q), [0, 0, 0, 0.25, 1])  # DAPO's per-problem scores


def test_cli_runs_and_rejects_bad_input(capsys):
    assert main(["calibrate", "--seeds", "3", "--studies", "40", "--old-studies", "5",
                 "--problems", "20"]) == 0
    assert "Calibration of the report's Δ interval" in capsys.readouterr().out
    assert main(["calibrate", "--accuracy", "0"]) == 2
    assert "--accuracy 0" in capsys.readouterr().err
    assert main(["calibrate", "--seeds", "1"]) == 2
    assert "at least 2 seeds" in capsys.readouterr().err
