"""The power planner against simulation: synthetic designs with known variance components,
analysed by the harness's own interval (`paired_bootstrap`), reject 0 at the planner's
minimum detectable difference 80% of the time and cover the true Δ as often as it says."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.__main__ import main as analysis_main
from analysis.power import Components, Design, coverage, estimate, mdd, needed
from analysis.stats import paired_bootstrap


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
                         ids=["pairs-exchangeable", "seed-and-problem-effects"])
def test_mdd_and_coverage_match_the_bootstrap_by_simulation(sd):
    design, sims = Design(3, 40, 4), 400
    comps = true_components(sd, 0.0)
    delta = mdd(comps, design)
    rng = np.random.default_rng(1)
    rejected = covered = 0
    for i in range(sims):
        m, b, _, _ = simulate(rng, sd, design, delta)
        d = paired_bootstrap(m.ravel(), b.ravel(), reps=400, seed=i)
        rejected += d.low > 0
        covered += d.low <= delta <= d.high
    mc = 3 * math.sqrt(0.8 * 0.2 / sims)
    assert rejected / sims == pytest.approx(0.8, abs=mc)
    cov = coverage(comps, design)
    assert covered / sims == pytest.approx(cov, abs=3 * math.sqrt(cov * (1 - cov) / sims) + 0.01)


def test_needed_design_reaches_the_target_and_one_less_does_not():
    comps, design = Components(1e-4, 4e-4, 1e-3, 0.4), Design(3, 40, 4)
    need = needed(comps, design, 0.05)
    for axis, value in need.items():
        assert value is not None
        assert mdd(comps, Design(**{**design.__dict__, axis: value})) <= 0.05
        assert mdd(comps, Design(**{**design.__dict__, axis: value - 1})) > 0.05
    # a seed component no number of samples can average away
    assert needed(Components(0.01, 0, 0, 0.4), design, 0.05)["samples"] is None


def test_cli_prints_mdd_per_benchmark_and_the_design_for_delta(sweep, capsys):
    assert analysis_main(["power", "--sweep-dir", str(sweep), "--delta", "5"]) == 0
    out = capsys.readouterr().out
    assert "aime24" in out and "amc23" in out and "to detect 5 points" in out


def test_cli_rejects_a_bad_delta(sweep, capsys):
    assert analysis_main(["power", "--sweep-dir", str(sweep), "--delta", "-1"]) == 2
    assert "--delta -1.0: must be a positive" in capsys.readouterr().err


def test_report_verdict_states_the_detectable_difference(sweep, tmp_path):
    import warnings

    from analysis.power import detectable_by_benchmark, sweep_power
    from analysis.report import build_report, check_options

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        md = build_report(check_options(sweep, tmp_path / "out")).read_text()
        spans = detectable_by_benchmark(sweep_power(sweep))
    lo, hi = spans["aime24"]
    size = f"{100 * lo:.2f}" if math.isclose(lo, hi) else f"{100 * lo:.2f}-{100 * hi:.2f}"
    verdict = md.split("\n\n")[1]
    assert "smallest difference this design could have detected on AIME24" in verdict
    assert size in verdict


def test_records_without_any_variation_give_no_detectable_difference(tmp_path):
    from analysis_fixtures import write_run

    from analysis.power import detectable_by_benchmark, sweep_power
    from analysis.verdict import detectable_sentence
    from common.metrics import metric_meta

    for label in ("DAPO", "GRPO"):
        for seed in (0, 1):
            write_run(tmp_path / "runs", f"{label.lower()}_s{seed}", label, seed, {},
                      evals={"toy": {5: 0.0}})
    spans = detectable_by_benchmark(sweep_power(tmp_path))
    assert all(math.isnan(v) for v in spans["toy"])
    assert "cannot be estimated" in detectable_sentence("toy", spans["toy"], metric_meta("mean"))
