"""Last/Best tables: numbers by hand, mean ± se over seeds, bold/underline, ties, paper join."""

from __future__ import annotations

import math
import warnings

import pandas as pd
import pytest
from analysis_fixtures import write_run

from analysis.collect import collect
from analysis.delta import DeltaOptions, Scores
from analysis.tables import (
    benchmark_order,
    last_best_table,
    last_best_tables,
    per_run_last_best,
    rank_marks,
    render_latex,
    render_markdown,
    write_last_best_tables,
)
from common.metrics import metric_meta


def _col(sweep):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return collect(sweep)


def _cell(tidy, label, bench, stat):
    row = tidy[(tidy.label == label) & (tidy.benchmark == bench) & (tidy.stat == stat)]
    assert len(row) == 1
    return row.iloc[0]


def test_last_and_best_per_run_by_hand(sweep):
    runs = per_run_last_best(_col(sweep).eval, "dapo").set_index(["run_id", "benchmark"])
    # urkl_s0 aime24: 0.50 @10, 0.40 @20 -> Last 0.40 (step 20), Best 0.50 (step 10)
    r = runs.loc[("urkl_s0", "aime24")]
    assert (r["last"], r["best"], r.last_step, r.best_step) == (0.40, 0.50, 20, 10)
    r = runs.loc[("grpo_s0", "amc23")]  # 0.50, 0.65
    assert (r["last"], r["best"], r.best_step) == (0.65, 0.65, 20)
    mv = per_run_last_best(_col(sweep).eval, "math_verify").set_index(["run_id", "benchmark"])
    assert mv.loc[("urkl_s0", "aime24"), "best"] == pytest.approx(0.45)


def test_mean_and_se_over_two_seeds_by_hand(sweep):
    tidy = last_best_table(_col(sweep).eval, "dapo")
    # RPG-URKL aime24 Last: seeds 0.40, 0.60 -> mean 0.50; sd = 0.1414 -> se = sd/sqrt(2) = 0.10
    last = _cell(tidy, "RPG-URKL", "aime24", "last")
    assert last["mean"] == pytest.approx(0.50) and last.se == pytest.approx(0.10)
    assert last.n_seeds == 2 and last.seeds == "0 1"
    # Best: 0.50, 0.60 -> 0.55 ± 0.05
    best = _cell(tidy, "RPG-URKL", "aime24", "best")
    assert best["mean"] == pytest.approx(0.55) and best.se == pytest.approx(0.05)
    # amc23 Best: 0.80, 0.90 -> 0.85 ± 0.05
    assert _cell(tidy, "RPG-URKL", "amc23", "best")["mean"] == pytest.approx(0.85)
    one = _cell(tidy, "GRPO", "aime24", "last")
    assert one["mean"] == pytest.approx(0.45) and math.isnan(one.se) and one.n_seeds == 1
    assert set(tidy.n) == {4}
    assert list(tidy.benchmark.unique()) == ["aime24", "amc23"]
    assert "REINFORCE++" not in set(tidy.label)  # no evaluations


def _md_rows(md: str) -> dict[str, list[str]]:
    rows = {}
    for line in md.splitlines():
        if line.startswith("| ") and not line.startswith("| Method"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0]] = cells[1:]
    return rows


def test_markdown_marks_ties_and_intervals(sweep):
    md = render_markdown(last_best_table(_col(sweep).eval, "dapo"))
    assert "| Method | AIME24 Last | AIME24 Best | AMC23 Last | AMC23 Best |" in md
    rows = _md_rows(md)
    # AIME24 Last: URKL 50.00 (seeds 0.40, 0.60: se 10.00, 95% t interval
    # 50 ± tan(0.475 pi) * 10 = 50 ± 127.06, clipped to [0, 100]: a Mean@n cannot leave it)
    # ties DAPO 50.00 (one seed: n/a); GRPO second
    assert rows["RPG-URKL"][0] == "**50.00 ± 10.00 [0.00, 100.00]**"
    assert rows["DAPO"][0] == "**50.00 ± n/a**"
    assert rows["GRPO"][0] == "<ins>45.00 ± n/a</ins>"
    # AIME24 Best: URKL 55.00 ± 5.00 and DAPO 55.00 tie; GRPO 45.00 second
    assert rows["RPG-URKL"][1] == "**55.00 ± 5.00 [0.00, 100.00]**"  # [-8.53, 118.53] clipped
    assert rows["DAPO"][1] == "**55.00 ± n/a**"
    # AMC23 Last: URKL 85.00, DAPO 70.00, GRPO 65.00 -> one bold, one underline, one plain
    assert rows["RPG-URKL"][2].startswith("**85.00 ± 5.00 [")
    assert rows["DAPO"][2] == "<ins>70.00 ± n/a</ins>" and rows["GRPO"][2] == "65.00 ± n/a"
    assert list(rows) == ["DAPO", "GRPO", "RPG-URKL"]
    assert "percent" in md and "Mean@4" in md and "95% t interval" in md
    assert "No Δ column: no per-problem records to pair with DAPO." in md


def _scores(col):
    return Scores.from_runs(col.runs)


def test_delta_vs_dapo_with_one_paired_seed_has_no_interval(sweep):
    """Per-problem Mean@4 (5 problems, correct answers filled problem by problem):
    DAPO aime24 @20 (0.50) = 1, 1, .5, 0, 0; GRPO @20 (0.45) = 1, 1, .25, 0, 0: Δ = -0.05 on
    the one seed both ran. One training run per side: no spread between runs to estimate, so
    no interval and no separation, however many problems."""
    col = _col(sweep)
    tidy = last_best_table(col.eval, "dapo", scores=_scores(col))
    g = _cell(tidy, "GRPO", "aime24", "last")
    assert g.delta == pytest.approx(-0.05) and (g.delta_seeds, g.delta_problems) == (1, 5)
    assert math.isnan(g.delta_low) and math.isnan(g.delta_high) and math.isnan(g.delta_p)
    # Best pairs each run's best step: GRPO @20 vs DAPO @10 (0.55 = 1, 1, .75, 0, 0)
    g = _cell(tidy, "GRPO", "aime24", "best")
    assert g.delta == pytest.approx(-0.10) and math.isnan(g.delta_low)
    # RPG-URKL ran seeds 0 and 1, DAPO only seed 0: only seed 0 pairs
    u = _cell(tidy, "RPG-URKL", "amc23", "last")  # @20 0.80 = 1,1,1,1,0 vs 0.70 = 1,1,1,.5,0
    assert u.delta == pytest.approx(0.10) and u.delta_seeds == 1
    assert math.isnan(_cell(tidy, "DAPO", "aime24", "last").delta)
    rows = _md_rows(render_markdown(tidy))
    assert rows["GRPO"][:2] == ["<ins>45.00 ± n/a</ins>", "-5.00"]
    assert rows["DAPO"][1] == "baseline"
    md = render_markdown(tidy)
    assert "| Method | AIME24 Last | Δ AIME24 Last | AIME24 Best | Δ AIME24 Best |" in md
    assert ("each seed's Δ averages the 5 problem(s) both runs answered, and the 95% paired t "
            "interval is over the 1 seed(s) both ran") in md
    assert "K = 0 Last comparison(s)" in md and "Best is a maximum over evaluated steps" in md


def test_delta_with_three_seeds_by_hand_and_holm_over_the_table(tmp_path):
    """Three seeds a side. UP: per-seed means 0.35, 0.40, 0.35 against DAPO's 0.25: Δ_s =
    0.10, 0.15, 0.10 (5 problems x 4 samples each), mean 0.1167, sd 0.0289; FLAT: 0.30, 0.20,
    0.25: Δ_s = 0.05, -0.05, 0 (p = 1). The paired t on 2 df, and Holm over the K = 2 Last
    comparisons (toy only)."""
    means = {"DAPO": (0.25, 0.25, 0.25), "UP": (0.35, 0.40, 0.35), "FLAT": (0.30, 0.20, 0.25)}
    for label, per_seed in means.items():
        for seed, mean in enumerate(per_seed):
            write_run(tmp_path / "runs", f"{label}{seed}", label, seed, {},
                      evals={"toy": {5: mean}})
    col = collect(tmp_path)
    tidy = last_best_table(col.eval, "dapo", scores=_scores(col))
    up = _cell(tidy, "UP", "toy", "last")
    d = [0.10, 0.15, 0.10]
    mean, sd = sum(d) / 3, math.sqrt(sum((x - sum(d) / 3) ** 2 for x in d) / 2)
    t2 = math.sqrt(2 * 0.9025 / 0.0975)  # t(0.975, 2)
    se = sd / math.sqrt(3)
    assert (up.delta, up.delta_low, up.delta_high) == (
        pytest.approx(mean), pytest.approx(mean - t2 * se), pytest.approx(mean + t2 * se))
    t = mean / se  # two-sided p on 2 df: 1 - t / sqrt(2 + t^2)
    assert up.delta_p == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-9)
    flat = _cell(tidy, "FLAT", "toy", "last")
    assert flat.delta == pytest.approx(0.0, abs=1e-15) and flat.delta_p == pytest.approx(1.0)
    assert up.delta_p_holm == pytest.approx(2 * up.delta_p)  # the smaller of K = 2
    assert flat.delta_p_holm == pytest.approx(1.0)
    rows = _md_rows(render_markdown(tidy))
    assert rows["UP"][1] == (f"+11.67 [{100 * (mean - t2 * se):+.2f}, {100 * (mean + t2 * se):+.2f}]"
                             f" (Holm p {2 * up.delta_p:.3f})")
    assert "K = 2 Last comparison(s) of this table that vary" in render_markdown(tidy)


def test_delta_follows_the_baseline_option(sweep):
    col = _col(sweep)
    a = last_best_table(col.eval, "dapo", scores=_scores(col))
    b = last_best_table(col.eval, "dapo", scores=_scores(col))
    pd.testing.assert_frame_equal(a, b)
    vs_grpo = last_best_table(col.eval, "dapo", scores=_scores(col),
                              delta=DeltaOptions(baseline="GRPO"))
    d = _cell(vs_grpo, "DAPO", "aime24", "last")
    assert d.delta == pytest.approx(0.05) and set(vs_grpo.baseline) == {"GRPO"}
    absent = last_best_table(col.eval, "dapo", scores=_scores(col),
                             delta=DeltaOptions(baseline="PPO"))
    assert absent.delta.isna().all()
    assert "No Δ column: the baseline PPO is not in this sweep." in render_markdown(absent)


def test_three_seeds_with_one_seed_baseline_keeps_working(tmp_path):
    """Three seeds of a method, one seed of DAPO: the method's cells get a t interval with
    2 degrees of freedom, DAPO's say n/a, and Δ pairs the one shared seed's problems."""
    for seed, mean in enumerate((0.40, 0.50, 0.60)):
        write_run(tmp_path / "runs", f"m{seed}", "M", seed, {}, evals={"toy": {5: mean}})
    write_run(tmp_path / "runs", "d0", "DAPO", 0, {}, evals={"toy": {5: 0.40}})
    col = collect(tmp_path)
    tidy = last_best_table(col.eval, "dapo", scores=_scores(col))
    m = _cell(tidy, "M", "toy", "last")
    half = math.sqrt(2 * 0.9025 / 0.0975) * 0.1 / math.sqrt(3)
    assert (m.ci95_low, m.ci95_high) == (pytest.approx(0.5 - half), pytest.approx(0.5 + half))
    assert m.delta == 0.0 and m.delta_seeds == 1  # seed 0: 0.40 vs 0.40
    rows = _md_rows(render_markdown(tidy))
    assert rows["M"][0] == "**50.00 ± 5.77 [25.16, 74.84]**"
    assert rows["DAPO"][0] == "<ins>40.00 ± n/a</ins>"
    assert rows["M"][1] == "0.00"  # one paired seed: no interval


def test_benchmarks_follow_the_evaluation_registry():
    from eval.benchmarks import BENCHMARKS

    assert benchmark_order(["toy", "aime24", "zzz", "amc23"]) == [
        *(b for b in BENCHMARKS if b in {"toy", "aime24", "amc23"}), "zzz"]


def test_latex_marks(sweep):
    col = _col(sweep)
    tex = render_latex(last_best_table(col.eval, "dapo"), "t")
    row = next(line for line in tex.splitlines() if line.startswith("RPG-URKL"))
    cells = [c.strip() for c in row.removesuffix("\\\\").split("&")]
    # t interval [-77.06, 177.06] clipped to what a Mean@n can be
    assert cells[1] == "\\textbf{50.00 $\\pm$ 10.00 [0.00, 100.00]}"
    assert cells[3].startswith("\\textbf{85.00 $\\pm$ 5.00 [")
    grpo = next(line for line in tex.splitlines() if line.startswith("GRPO"))
    assert "\\underline{45.00 $\\pm$ n/a}" in grpo
    assert "\\multicolumn{2}{c}{AIME24}" in tex and "\\cmidrule(lr){2-3}" in tex
    assert tex.count("\\begin{tabular}{lcccc}") == 1
    # with the Δ columns every benchmark spans four: Last, Δ Last, Best, Δ Best
    tex = render_latex(last_best_table(col.eval, "dapo", scores=_scores(col)), "t")
    assert "\\multicolumn{4}{c}{AIME24}" in tex and "\\cmidrule(lr){6-9}" in tex
    assert " & Last & $\\Delta$ Last & Best & $\\Delta$ Best" in tex


def test_rank_marks_rules():
    acc = metric_meta("mean")
    assert rank_marks([0.5, 0.4, 0.4, 0.1], acc) == ["best", "second", "second", ""]
    assert rank_marks([0.5, 0.5, 0.4], acc) == ["best", "best", "second"]
    # ties are judged on the displayed numbers: 12.34 and 12.34
    assert rank_marks([0.123441, 0.123449, 0.1], acc) == ["best", "best", "second"]
    assert rank_marks([0.3, float("nan"), 0.2], acc) == ["best", "", "second"]
    assert rank_marks([0.3], acc) == [""]
    assert rank_marks([0.2, 0.2], acc) == ["best", "best"]
    # a lower-is-better metric ranks the other way; a diagnostic gets no marks
    assert rank_marks([0.1, 0.3, 0.2], metric_meta("extract_fail_rate")) == ["best", "", "second"]
    assert rank_marks([1.0, 2.0], metric_meta("entropy")) == ["", ""]


def test_written_files(sweep, tmp_path):
    col = _col(sweep)
    files = write_last_best_tables(
        last_best_tables(col.eval, scores=_scores(col)), tmp_path / "tables"
    )
    assert set(files) == {"dapo", "math_verify"}
    csv = pd.read_csv(files["math_verify"]["csv"])
    assert set(csv.columns) >= {"scorer", "label", "benchmark", "stat", "mean", "se", "n_seeds",
                                "ci95_low", "ci95_high", "baseline", "delta", "delta_low",
                                "delta_high", "delta_p", "delta_p_holm", "delta_seeds",
                                "delta_problems"}
    # math_verify = dapo - 0.05: GRPO aime24 Last 0.40
    v = csv[(csv.label == "GRPO") & (csv.benchmark == "aime24") & (csv.stat == "last")]["mean"]
    assert v.iloc[0] == pytest.approx(0.40)
    assert files["dapo"]["md"].read_text().count("\n| ") == 4
    assert "\\end{table}" in files["dapo"]["tex"].read_text()


def test_two_runs_with_one_label_and_seed_are_rejected(tmp_path):
    for rid, beta in (("a", "1e-3"), ("b", "1e-4")):
        write_run(
            tmp_path / "runs",
            rid,
            "RPG-URKL",
            0,
            {"method": "RPG-URKL", "beta": beta},
            evals={"aime24": {5: 0.5}},
        )
    with pytest.raises(ValueError, match=r"\['a', 'b'\] share label 'RPG-URKL'"):
        last_best_table(collect(tmp_path).eval, "dapo")


def test_best_is_taken_over_evaluations_of_lasts_problem_set_only():
    """Steps 4-12 on the first 40 questions, step 16 on all 100 (eval.limit_before_last):
    a 55.0 on the 40 is another quantity than Last's 50.0 on the 100, so Best is step 16's;
    with one problem set throughout, Best is the maximum over every step."""
    rows = [{"run_id": "dapo_s0", "label": "DAPO", "seed": 0, "benchmark": "arithmetic",
             "scorer": "dapo", "step": step, "mean": mean, "num_problems": problems, "n": 4}
            for step, mean, problems in ((4, 0.40, 40), (8, 0.55, 40), (16, 0.50, 100))]
    run = per_run_last_best(pd.DataFrame(rows), "dapo").iloc[0]
    assert (run["best"], run["best_step"], run["last"]) == (0.50, 16, 0.50)
    one_set = pd.DataFrame(rows).assign(num_problems=100)
    assert per_run_last_best(one_set, "dapo").iloc[0]["best_step"] == 8
