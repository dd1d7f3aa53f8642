"""The harness checks its own intervals, through the report's own code: simulated sweeps in
the collector's format go through last_best_table (paired t over seeds, Holm over K) and the
verdict's reading. Where runs differ by 4 points the report's intervals separate about 5% of
null comparisons at 3 and at 5 seeds and Holm keeps the family-wise rate at or below 5%;
with the old bootstrap over (problem, seed) pairs put back into analysis.delta, calibrate
fails (exit 1). A large real effect still shows, and the planner's detectable Δ is detected
about 80% of the time."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from analysis_fixtures import write_run

from analysis import delta as delta_module
from analysis.__main__ import main
from analysis.calibrate import Model, beta_accuracies, calibrate, rate, render, sweep_model
from analysis.stats import SeedDelta, problem_bootstrap

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def calibration():
    q = beta_accuracies(0.25, 0.15, 121)
    return calibrate(Model(q, run_sd=0.04, interaction_sd=0.03, samples=4), seeds=(3, 5),
                     studies=150, effect=0.30, family=3, seed=0)


def test_the_report_path_is_calibrated(calibration):
    assert calibration.calibrated
    for row in calibration.rows:
        assert row.null.comparisons == 450 and row.null.studies == 150
        assert row.false_rate[0] <= 0.08, row  # the run as the unit: about 5%
        assert row.familywise_rate[0] <= 0.08, row  # Holm over K = 3
        assert row.power_at_effect[0] >= 0.9, row  # a 30-point effect still shows


def test_the_planners_detectable_difference_is_detected_about_80_percent(calibration):
    for row in calibration.rows:
        assert 0.70 <= row.power_at_mdd[0] <= 0.90, row
    three, five = calibration.rows
    assert five.mdd < three.mdd  # more seeds, a smaller detectable difference


def _old_bootstrap(method, baseline):
    """The harness's interval before issue 45, put back: a bootstrap over (problem, seed)
    pairs as if independent (it had no p value: an interval that excludes 0 gets p = 0)."""
    delta, low, high = problem_bootstrap(method, baseline, reps=400)
    return SeedDelta(delta, low, high, 0.0 if low > 0 or high < 0 else 1.0, math.nan,
                     len(method), len(method[0]))


def test_calibrate_fails_with_the_old_bootstrap_put_back(monkeypatch, capsys):
    args = ["calibrate", "--seeds", "3", "--studies", "40", "--family", "2"]
    assert main(args) == 0
    assert "NOT CALIBRATED" not in capsys.readouterr().out
    monkeypatch.setattr(delta_module, "seed_delta", _old_bootstrap)
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "NOT CALIBRATED" in out
    row = next(line for line in out.splitlines() if line.split()[:1] == ["3"])
    false_rate = float(row.split()[1].rstrip("%"))
    assert false_rate >= 20  # separates a fifth or more of null comparisons


def test_render_states_each_figure(calibration):
    text = render(calibration)
    assert "run-to-run sd 4.00 points" in text and "K = 3 Last comparisons" in text
    for row in calibration.rows:
        assert f"{100 * row.false_rate[0]:5.1f}%" in text and f"{100 * row.mdd:10.2f}" in text
    assert "calibrated: no false-separation interval lies wholly above 5%" in text
    assert text.endswith("planner: the power at its detectable Δ is within 80% +- 5 points")


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


def test_a_snapshot_defines_the_model_too():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = sweep_model(str(REPO / "docs" / "runs" / "default-host"), "dapo", "toy", "DAPO")
    assert model.problems == 121 and model.samples == 4 and model.run_sd > 0


def test_cli_runs_and_rejects_bad_input(capsys):
    assert main(["calibrate", "--seeds", "3", "--studies", "10", "--problems", "20"]) == 0
    assert "Calibration of the report's Δ interval" in capsys.readouterr().out
    assert main(["calibrate", "--accuracy", "0"]) == 2
    assert "--accuracy 0" in capsys.readouterr().err
    assert main(["calibrate", "--seeds", "1"]) == 2
    assert "at least 2 seeds" in capsys.readouterr().err


def test_an_effect_is_injected_so_that_its_mean_survives_the_clip():
    """shift_for: problems at 0 lose part of a plain shift to the clip, so the injected
    shift is larger; its expected gain, by quadrature of the clipped normal, is the effect."""
    from scipy import integrate, stats

    q = np.array([0.0, 0.0, 0.02, 0.3, 0.6, 0.97])
    model = Model(q, run_sd=0.02, interaction_sd=0.11, samples=4)
    sd = math.hypot(0.02, 0.11)

    def mean_after_clip(m):
        return integrate.quad(lambda z: min(max(m + z, 0.0), 1.0) * stats.norm.pdf(z, 0, sd),
                              -12 * sd, 12 * sd, points=[-m, 1 - m], epsabs=1e-13,
                              limit=200)[0]

    for effect in (0.11, -0.05, 0.30):
        shift = model.shift_for(effect)
        assert abs(shift) > abs(effect)
        gain = np.mean([mean_after_clip(x + shift) - mean_after_clip(x) for x in q])
        assert gain == pytest.approx(effect, abs=1e-9)
    assert model.shift_for(0.0) == 0.0
    with pytest.raises(ValueError, match="more than the scale allows"):
        model.shift_for(0.70)


def test_a_planner_that_promises_too_much_fails_calibrate(monkeypatch, capsys):
    """The planner's detectable Δ halved: the power there falls far below 80%, and
    calibrate says so and exits 1 (the false-separation rates are unchanged)."""
    from analysis import calibrate as calibrate_module

    args = ["calibrate", "--seeds", "3", "--studies", "40", "--family", "2"]
    assert main(args) == 0
    assert "planner: the power at its detectable Δ is within 80% +- 5" in capsys.readouterr().out
    honest = calibrate_module.planner_mdd
    monkeypatch.setattr(calibrate_module, "planner_mdd", lambda *a: honest(*a) / 2)
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "PLANNER OFF" in out and "NOT CALIBRATED" not in out


def test_the_default_snapshots_planner_delivers_its_power(capsys):
    """`calibrate --sweep-dir docs/runs/default-host`: the power at the planner's detectable
    Δ is stated and within 80% +- 5 points (effects injected through the clip)."""
    assert main(["calibrate", "--sweep-dir", str(REPO / "docs" / "runs" / "default-host"),
                 "--seeds", "3", "--studies", "120"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.split()[:1] == ["3"])
    assert 70 <= float(row.split()[8].rstrip("%")) <= 90, row  # power there
    assert "planner: the power at its detectable Δ is within 80% +- 5 points" in out
