"""The power planner against simulation: synthetic designs with known variance components,
analysed by the harness's own interval (`seed_delta`, the paired t over seeds), reject 0 at
the planner's minimum detectable difference 80% of the time and 5% of the time at 0; where
the run-to-run component dominates, the planner says more problems cannot help."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from analysis.__main__ import main as analysis_main
from analysis.power import (
    Components,
    Design,
    PowerRow,
    advice,
    delta_sd,
    estimate,
    expected_power,
    floor,
    mdd,
    mdd_interval,
    needed,
    sd_interval,
    t_mdd,
    t_power,
    trade,
)
from analysis.stats import seed_delta


def simulate(rng, sd: tuple[float, float, float], design: Design, delta: float):
    """(method, base) Mean@n arrays (S, P): base difficulty per problem in [0.3, 0.7]; the
    method adds delta + seed + problem + interaction effects (normal, sd given)."""
    s, p, n = design.seeds, design.problems, design.samples
    q = np.broadcast_to(rng.uniform(0.3, 0.7, p), (s, p))
    shift = (delta + rng.normal(0, sd[0], (s, 1)) + rng.normal(0, sd[1], (1, p))
             + rng.normal(0, sd[2], (s, p)))
    pm = np.clip(q + shift, 0.0, 1.0)
    return rng.binomial(n, pm) / n, rng.binomial(n, q) / n, pm, q


def true_components(sd, delta: float) -> Components:
    rng = np.random.default_rng(123)  # the within-sample variance, by a large draw
    _, _, pm, q = simulate(rng, sd, Design(200, 400, 2), delta)
    within = float(np.mean(pm * (1 - pm) + q * (1 - q)))
    return Components(sd[0] ** 2, sd[1] ** 2, sd[2] ** 2, within)


def test_estimate_recovers_known_components():
    sd, design = (0.03, 0.05, 0.06), Design(30, 300, 64)
    m, b, _, _ = simulate(np.random.default_rng(0), sd, design, 0.02)
    got, want = estimate(m, b, design.samples), true_components(sd, 0.02)
    assert got.seed == pytest.approx(want.seed, rel=0.6)
    assert got.problem == pytest.approx(want.problem, rel=0.25)
    assert got.interaction == pytest.approx(want.interaction, rel=0.3)
    assert got.within == pytest.approx(want.within, rel=0.02)


@pytest.mark.parametrize("sd", [(0.0, 0.0, 0.05), (0.04, 0.03, 0.03)],
                         ids=["no-run-component", "run-and-problem-effects"])
def test_mdd_is_detected_80_percent_of_the_time_and_0_separates_5_percent(sd):
    design, sims = Design(3, 40, 4), 600
    comps = true_components(sd, 0.0)
    delta = mdd(comps, design)
    rng = np.random.default_rng(1)
    hits = false = 0
    for _ in range(sims):
        m, b, _, _ = simulate(rng, sd, design, delta)
        hits += seed_delta(m, b).low > 0
        m, b, _, _ = simulate(rng, sd, design, 0.0)
        false += seed_delta(m, b).verdict != "tie"
    assert hits / sims == pytest.approx(0.8, abs=3 * math.sqrt(0.8 * 0.2 / sims) + 0.02)
    assert false / sims == pytest.approx(0.05, abs=3 * math.sqrt(0.05 * 0.95 / sims))


def test_t_power_and_mdd_by_hand():
    # at Δ = 0 a two-sided 95% test rejects 5% of the time, whatever the seeds
    assert t_power(0.0, 1.0, 3) == pytest.approx(0.05, abs=1e-9)
    assert t_power(0.0, 1.0, 20) == pytest.approx(0.05, abs=1e-9)
    # many seeds: the noncentral t tends to the normal, MDD -> (z_0.975 + z_0.8) sd / sqrt(S)
    assert t_mdd(1.0, 2000) == pytest.approx((1.959964 + 0.841621) / math.sqrt(2000), rel=1e-3)
    assert t_power(t_mdd(0.3, 5), 0.3, 5) == pytest.approx(0.8, abs=1e-9)
    assert math.isnan(t_mdd(1.0, 1)) and t_mdd(0.0, 3) == 0.0


def test_more_problems_cannot_beat_the_run_to_run_floor():
    comps = Components(seed=0.03 ** 2, problem=0.0, interaction=0.02 ** 2, within=0.4)
    design = Design(3, 121, 4)
    assert delta_sd(comps, design) == pytest.approx(math.sqrt(9e-4 + 4e-4 / 121 + 0.4 / 484))
    lowest = floor(comps, 3)
    assert lowest == pytest.approx(t_mdd(0.03, 3)) and mdd(comps, design) > lowest
    assert mdd(comps, Design(3, 100_000, 4096)) == pytest.approx(lowest, rel=1e-3)
    need = needed(comps, design, lowest * 0.9)  # below the floor: only seeds help
    assert need["problems"] is None and need["samples"] is None and need["seeds"] > 3
    row = PowerRow("toy", "M", design, comps)
    said = advice(row)[-1]
    assert "more problems or samples cannot help" in said and f"{100 * lowest:.2f}" in said
    small_run = " ".join(advice(PowerRow("toy", "M", design, Components(0, 0, 0.01, 0.4))))
    assert "cannot help" not in small_run
    assert "one seed" in advice(PowerRow("toy", "M", Design(1, 121, 4), comps))[0]


def test_cli_prints_mdd_per_benchmark_and_the_design_for_delta(sweep, capsys):
    assert analysis_main(["power", "--sweep-dir", str(sweep), "--delta", "5"]) == 0
    out = capsys.readouterr().out
    assert "aime24" in out and "amc23" in out and "to detect 5 points" in out
    assert "paired t over seeds" in out and "floor" in out


def test_cli_rejects_a_bad_delta(sweep, capsys):
    assert analysis_main(["power", "--sweep-dir", str(sweep), "--delta", "-1"]) == 2
    assert "--delta -1.0: must be a positive" in capsys.readouterr().err


def test_report_verdict_states_the_detectable_difference(tmp_path):
    import warnings

    from analysis_fixtures import write_run

    from analysis.power import detectable_by_benchmark, sweep_power
    from analysis.report import build_report, check_options

    for label, means in {"DAPO": (0.25, 0.30, 0.20), "GRPO": (0.35, 0.25, 0.30)}.items():
        for seed, mean in enumerate(means):
            write_run(tmp_path / "runs", f"{label.lower()}_s{seed}", label, seed, {},
                      evals={"toy": {5: mean}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        md = build_report(check_options(tmp_path, tmp_path / "out")).read_text()
        span = detectable_by_benchmark(sweep_power(tmp_path))["toy"]
    assert span.low == span.high and not math.isnan(span.low)  # one method: one MDD
    verdict = md.split("\n\n")[1]
    assert "smallest difference this design detects on Toy" in verdict
    assert f"is {100 * span.low:.2f}, an estimate from a variance on 2 df" in verdict


def test_one_paired_seed_gives_no_detectable_difference_and_says_why(sweep, tmp_path):
    import warnings

    from analysis.power import detectable_by_benchmark, sweep_power
    from analysis.report import build_report, check_options

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        md = build_report(check_options(sweep, tmp_path / "out")).read_text()
        span = detectable_by_benchmark(sweep_power(sweep))["aime24"]
    assert math.isnan(span.low) and span.why == "one seed"  # DAPO ran seed 0 only
    assert ("On AIME24 the smallest detectable difference cannot be estimated: only one seed "
            "is paired with the baseline, so no interval exists.") in md


def test_records_without_any_variation_give_no_detectable_difference(tmp_path):
    from analysis_fixtures import write_run

    from analysis.power import detectable_by_benchmark, sweep_power
    from analysis.verdict import detectable_sentence
    from common.metrics import metric_meta

    for label in ("DAPO", "GRPO"):
        for seed in (0, 1):
            write_run(tmp_path / "runs", f"{label.lower()}_s{seed}", label, seed, {},
                      evals={"toy": {5: 0.0}})
    span = detectable_by_benchmark(sweep_power(tmp_path))["toy"]
    assert math.isnan(span.low) and span.why == "no variation"
    assert "every sample scored the same on both sides" in detectable_sentence(
        "toy", span, metric_meta("mean"))


def test_a_detectable_size_never_exceeds_the_metrics_scale():
    """Two seeds (1 df) put the upper end of the detectable size far past 100 points (2282.75
    was printed): said as more than the scale allows, never as a number beyond it."""
    from analysis.power import Detectable
    from analysis.verdict import detectable_sentence
    from common.metrics import metric_meta

    text = detectable_sentence("toy", Detectable(0.30, 0.45, upper=22.8275, df=1),
                               metric_meta("mean"))
    assert "is 30.00-45.00" in text and "2282" not in text
    assert "its 95% upper end is more than the scale allows (100.00)" in text
    text = detectable_sentence("toy", Detectable(1.4, 1.4, upper=30.0, df=1), metric_meta("mean"))
    assert "is more than the scale allows" in text and "140" not in text
    within = detectable_sentence("toy", Detectable(0.1, 0.1, upper=0.3, df=4), metric_meta("mean"))
    assert "may be up to 30.00 (95% upper end)" in within


def test_the_detectable_size_has_its_own_chi_square_interval():
    # (S - 1) sd^2 / sigma^2 ~ chi2(S - 1): with 3 seeds sigma lies in [0.52, 6.28] x sd
    lo, hi = sd_interval(1.0, 3)
    assert (lo, hi) == (pytest.approx((2 / stats.chi2.ppf(0.975, 2)) ** 0.5),
                        pytest.approx((2 / stats.chi2.ppf(0.025, 2)) ** 0.5))
    c, d = Components(0.03 ** 2, 0.0, 0.05 ** 2, 0.4), Design(3, 121, 4)
    point = mdd(c, d)
    low, high = mdd_interval(c, d)
    assert low < point < high and high == pytest.approx(point * hi, rel=1e-9)
    assert math.isnan(sd_interval(1.0, 1)[0])


def test_the_point_mdd_gives_less_than_80_percent_power_with_few_seeds():
    # a design sized on an sd estimated from S runs: simulate the estimate (sigma = 1) and
    # average the true power at the MDD it implies; the planner's figure must match that
    rng = np.random.default_rng(0)
    for seeds in (3, 5):
        sd_hat = rng.normal(size=(20000, seeds)).std(axis=1, ddof=1)
        df, crit = seeds - 1, stats.t.ppf(0.975, seeds - 1)
        ncp = sd_hat * t_mdd(1.0, seeds) * seeds ** 0.5  # t_mdd scales with the sd
        wrong_side = np.nan_to_num(stats.nct.cdf(-crit, df, ncp))  # NaN deep in the tail
        simulated = float(np.mean(stats.nct.sf(crit, df, ncp) + wrong_side))
        assert expected_power(t_mdd(1.0, seeds), 1.0, seeds) == pytest.approx(simulated,
                                                                             abs=0.01)
        assert simulated < 0.78  # not the 80% a point figure promises
    # it approaches the nominal 80% as the sd's estimate firms up
    by_seeds = [expected_power(t_mdd(1.0, s), 1.0, s) for s in (3, 5, 20, 60)]
    assert by_seeds == sorted(by_seeds) and 0.78 < by_seeds[-1] < 0.8


def test_the_planner_prints_the_interval_the_power_and_the_trade():
    c, d = Components(0.01 ** 2, 0.0, 0.0, 0.4), Design(10, 20, 2)
    row = PowerRow("toy", "M", d, c)
    said = " ".join(advice(row))
    lo, hi = row.mdd_interval
    assert f"true MDD lies in [{100 * lo:.2f}, {100 * hi:.2f}] (95%)" in said
    assert f"gives {100 * row.power_at_mdd:.0f}% power, not 80%" in said
    t = trade(c, d)
    assert t["one more seed"] < t["now"] and t["twice the samples"] < t["now"]
    assert f"one more seed: MDD {100 * t['one more seed']:.2f}" in said
    # little run-to-run variance and a large within-sample one: samples buy more here
    assert t["twice the samples"] < t["one more seed"] and "twice the samples buys more" in said


def test_the_planner_reads_a_snapshot(capsys):
    from pathlib import Path

    snap = Path(__file__).resolve().parents[2] / "docs" / "runs" / "default-host"
    assert analysis_main(["power", "--sweep-dir", str(snap)]) == 0
    out = capsys.readouterr().out
    assert "toy" in out and "MDD 95%" in out and "buys more" in out
    assert analysis_main(["power", "--sweep-dir", str(snap.parent)]) == 2
    assert "neither a sweep" in capsys.readouterr().err
