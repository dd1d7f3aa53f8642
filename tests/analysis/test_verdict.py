"""The verdict paragraph, computed on constructed sweeps: a clear winner (and loser), a tie,
and separations that do not survive Holm's adjustment."""

from __future__ import annotations

import json
import warnings

import pandas as pd
import pytest
from analysis_fixtures import per_problem, summary, write_run
from scipy.stats import chi2

from analysis.power import detectable_by_benchmark, sweep_power
from analysis.report import build_report, check_options
from analysis.stats import holm, seed_delta
from analysis.tables import format_p


def head(k: int) -> str:
    return ("**Verdict** (computed from the tables below: scorer `dapo`, Mean@4 at Last, 3 "
            "seed(s) per method; Δ = method - DAPO (percentage points), paired by seed with the "
            "training run as the unit, with its 95% paired t interval over seeds; "
            f"K = {k} comparison(s) at Last, read through Holm's adjustment: a finding is a Δ "
            "whose interval excludes 0 and whose Holm p is below 0.05).")


def _sweep(root, means: dict[str, tuple[float, float, float]], initial: float | None = None):
    """One run per (label, seed) with a single toy evaluation at step 5."""
    for label, per_seed in means.items():
        for seed, mean in enumerate(per_seed):
            write_run(root / "runs", f"{label.lower()}_s{seed}", label, seed, {},
                      evals={"toy": {5: mean}})
    if initial is not None:
        d = root / "initial" / "eval" / "step_0"
        d.mkdir(parents=True)
        (d / "toy.json").write_text(json.dumps(summary("toy", 0, initial)))
    return root


def _verdict(root) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        md = build_report(check_options(root, root / "out")).read_text()
    return md.split("\n")[2]  # the first paragraph, right under the title


def _delta(method, base):
    """seed_delta of per-seed means, through the fixture's per-problem scores."""
    return seed_delta([per_problem(m) for m in method], [per_problem(b) for b in base])


def _interval(method, base, p_holm: float | None = None) -> str:
    """The expected Δ text: the paired t over seeds, with its Holm p when given."""
    d = _delta(method, base)
    fmt = lambda v: "0.00" if round(v * 100, 2) == 0 else f"{v * 100:+.2f}"  # noqa: E731
    text = f"{fmt(d.delta)} [{fmt(d.low)}, {fmt(d.high)}]"
    return text if p_holm is None else f"{text} (Holm p {format_p(p_holm)})"


def _detectable(root) -> str:
    """The expected detectable-difference sentence, from analysis.power's MDD per method."""
    rows = sweep_power(root)
    span = detectable_by_benchmark(rows)["toy"]
    lo, hi = span.low, span.high
    size = f"{100 * lo:.2f}" if round(lo, 6) == round(hi, 6) else f"{100 * lo:.2f}-{100 * hi:.2f}"
    # the MDD scales with the sd; its upper end is the sd's chi-square upper end on 2 df
    upper = max(r.mdd for r in rows) * (2 / chi2.ppf(0.025, 2)) ** 0.5
    said = (f"the true size may be up to {100 * upper:.2f} (95% upper end)" if upper <= 1 else
            "its 95% upper end is more than the scale allows (100.00)")  # past 100 points
    return (" The smallest difference this design detects on Toy (paired t over seeds at 95%, "
            f"80% power, unadjusted; `python -m analysis power`) is {size}, an estimate from a "
            f"variance on 2 df: {said}, and the point figure gives less than 80% power.")


def test_a_clear_winner_and_a_clear_loser(tmp_path):
    # per problem: DAPO 0.25 = 1, .25, 0, 0, 0; WIN 0.95 = 1, 1, 1, 1, .75; LOSE 0.05 = .25,
    # 0, 0, 0, 0. Δ_s: WIN +0.70, +0.60, +0.70; LOSE -0.20, -0.20, -0.25 (t > 20 on 2 df)
    dapo, win, lose = (0.25, 0.30, 0.25), (0.95, 0.90, 0.95), (0.05, 0.10, 0.00)
    root = _sweep(tmp_path, {"DAPO": dapo, "WIN": win, "LOSE": lose}, initial=0.05)
    text = _verdict(root)
    p = holm([_delta(win, dapo).p, _delta(lose, dapo).p])
    assert text.startswith(
        f"{head(2)} On Toy, better than DAPO (a finding: Holm p < 0.05): WIN "
        f"({_interval(win, dapo, p[0])}); worse than DAPO (a finding: Holm p < 0.05): LOSE "
        f"({_interval(lose, dapo, p[1])}).{_detectable(root)} The warm start (the initial "
        "model, before any RL step) scores 5.00 on Toy; gain at Last over it, with the "
        "method's seed interval less that score (one evaluation, taken as fixed): DAPO +21.67 [")
    assert "its 95% interval lies above the warm start for DAPO, WIN. Grader check: " in text
    assert _interval(win, dapo).startswith("+66.67 [+")


def test_constant_differences_are_not_tested(tmp_path):
    # CONST scores 0.50 and DAPO 0.25 on every seed: Δ_s = +0.25 three times. The t
    # statistic is infinite, so the old rule gave [+25.00, +25.00] (Holm p <0.001), a
    # finding; SAME equals DAPO on every seed (Δ_s = 0): nothing to test. Neither is in K,
    # and no warm-start gain of a score that never varies claims an interval
    dapo, const = (0.25,) * 3, (0.50,) * 3
    root = _sweep(tmp_path, {"DAPO": dapo, "CONST": const, "SAME": dapo}, initial=0.05)
    text = _verdict(root)
    assert text.startswith(
        f"{head(0)} On Toy, the same Δ in every seed, so no spread to test, no p value and no "
        "finding: CONST (+25.00 in each of 3 seeds); nothing to test (Δ = 0 in every seed, no "
        "spread): SAME.")
    assert "CONST +45.00 (the same in each of 3 seeds: no interval)" in text
    assert "a finding:" not in text and "(Holm p" not in text
    table = (root / "out" / "tables" / "last_best_dapo.md").read_text()
    assert "+25.00 (constant over 3 seeds)" in table and "0.00 (nothing to test)" in table
    assert "[+25.00, +25.00]" not in table


def test_a_negative_kl_estimate_keeps_an_ordered_interval(tmp_path):
    # k1 estimates of KL(pi_ckpt || pi_init) below 0 (sampling noise near the initial model):
    # the interval clipped at 0 stays ordered, [0.000, 0.000] in the CSV, never low 0 and
    # high -0.003 as before; a cell says there is no interval rather than print [0.000, 0.000]
    for seed, kl in enumerate((-0.02, -0.01, -0.015)):
        write_run(tmp_path / "runs", f"dapo_s{seed}", "DAPO", seed, {},
                  evals={"toy": {5: 0.25}}, kls={"toy": {5: kl}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_report(check_options(tmp_path, tmp_path / "out"))
    tidy = pd.read_csv(tmp_path / "out" / "tables" / "last_best_dapo.csv")
    last = tidy[tidy["stat"] == "last"].iloc[0]
    assert last.kl == pytest.approx(-0.015) and last.kl_ci95_low <= last.kl_ci95_high
    table = (tmp_path / "out" / "tables" / "last_best_dapo.md").read_text()
    assert "-0.015 ± 0.003 (its interval lies wholly beyond 0.000: none)" in table
    assert "[0.000, 0.000]" not in table and "†" not in table


def test_a_separation_that_does_not_survive_holm_is_unadjusted_only(tmp_path):
    # Δ_s = +0.05, +0.10, +0.10 for UP1 and UP2: mean 0.0833, sd 0.0289, t = 5.0 on 2 df,
    # p = 0.0377 < 0.05, so each interval excludes 0; FLAT ties (p = 1). K = 3: Holm gives
    # 3 x 0.0377 = 0.113 to both, so neither is a finding
    dapo, up, flat = (0.25,) * 3, (0.30, 0.35, 0.35), (0.25, 0.30, 0.20)
    root = _sweep(tmp_path, {"DAPO": dapo, "UP1": up, "UP2": up, "FLAT": flat})
    d = _delta(up, dapo)
    assert d.low > 0 and d.p == pytest.approx(0.0377, abs=1e-4)
    adjusted = holm([d.p, d.p, _delta(flat, dapo).p])
    assert adjusted[0] == pytest.approx(3 * d.p)
    text = _verdict(root)
    assert text.startswith(head(3))
    assert (f"On Toy, above DAPO at 95% unadjusted only (not after Holm): "
            f"UP1 ({_interval(up, dapo, adjusted[0])}), UP2 ({_interval(up, dapo, adjusted[0])}); "
            f"not distinguishable from DAPO at 95%: FLAT") in text
    assert "a finding:" not in text


def test_a_tie(tmp_path):
    # NOISY is above DAPO on seed 0, below on seed 1, equal on seed 2: Δ = 0, and the
    # interval straddles 0, so the verdict must say "not distinguishable"
    dapo, noisy = (0.25, 0.25, 0.25), (0.30, 0.20, 0.25)
    root = _sweep(tmp_path, {"DAPO": dapo, "NOISY": noisy})
    text = _verdict(root)
    expected = _interval(noisy, dapo)
    assert expected.startswith("0.00 [-") and ", +" in expected
    p = _delta(noisy, dapo).p
    assert text == (
        f"{head(1)} On Toy, no method is distinguishable from DAPO at 95%: NOISY ({expected} "
        f"(Holm p {format_p(p)}))."
        f"{_detectable(root)}"
    )


def test_mixed_verdict_names_each_group(tmp_path):
    dapo = (0.25, 0.30, 0.25)
    root = _sweep(tmp_path, {"DAPO": dapo, "WIN": (0.95, 0.90, 0.95), "SAME": dapo,
                             "TIE": (0.30, 0.25, 0.25)})
    text = _verdict(root)
    assert text.startswith(head(2))  # WIN and TIE: SAME has nothing to test
    assert "better than DAPO (a finding: Holm p < 0.05): WIN (+66.67 [" in text
    assert "; not distinguishable from DAPO at 95%: TIE (0.00 [-" in text
    # SAME is DAPO's runs again: Δ_s = 0 on every seed, no spread; never a tested tie
    assert "; nothing to test (Δ = 0 in every seed, no spread): SAME." in text
    assert "SAME (0.00 [0.00, 0.00]" not in text and "worse than" not in text


def test_a_gain_whose_seed_interval_reaches_the_warm_start_is_not_a_rise(tmp_path):
    # UP: 0.30, 0.35, 0.35 (mean 0.3333, se 0.0167, t(2) 4.303: [0.2616, 0.4050]); the warm
    # start 0.30 lies inside, so +3.33 over it is not a rise at 95%; DAPO 0.25 x 3 is below
    root = _sweep(tmp_path, {"DAPO": (0.25,) * 3, "UP": (0.30, 0.35, 0.35)}, initial=0.30)
    text = _verdict(root)
    assert text.split(" Grader check: ")[0].endswith(
        "scores 30.00 on Toy; gain at Last over it, with the method's seed interval less that "
        "score (one evaluation, taken as fixed): DAPO -5.00 (the same in each of 3 seeds: no "
        "interval), UP +3.33 [-3.84, "
        "+10.50]; no method's 95% interval lies wholly above the warm start."), text


def test_unequal_seed_sets_say_how_many_seeds_a_delta_pairs(tmp_path):
    """DAPO has seeds {0, 1, 3}, GRPO {0, 1, 2}: GRPO's Δ rests on the 2 shared seeds (1 df),
    and the header says so instead of only "3 seed(s) per method"."""
    for seed, mean in zip((0, 1, 3), (0.25, 0.30, 0.35)):
        write_run(tmp_path / "runs", f"dapo_s{seed}", "DAPO", seed, {}, evals={"toy": {5: mean}})
    for seed, mean in zip((0, 1, 2), (0.40, 0.50, 0.45)):
        write_run(tmp_path / "runs", f"grpo_s{seed}", "GRPO", seed, {}, evals={"toy": {5: mean}})
    text = _verdict(tmp_path)
    assert ("Mean@4 at Last, 3 seed(s) per method (seeds shared with DAPO, all a Δ pairs: "
            "only 2 for GRPO); Δ = method - DAPO") in text


def test_a_missing_evaluation_step_is_named_in_the_verdict(tmp_path):
    """GRPO seed 1 lacks its step-20 evaluation, so its Last is step 10 while DAPO's is 20:
    the verdict says the pair spans different steps, not only the table's caption."""
    for label in ("DAPO", "GRPO"):
        for seed, mean in enumerate((0.25, 0.30, 0.35)):
            steps = {10: mean} if (label, seed) == ("GRPO", 1) else {10: mean, 20: mean + 0.05}
            write_run(tmp_path / "runs", f"{label.lower()}_s{seed}", label, seed, {},
                      evals={"toy": steps})
    text = _verdict(tmp_path)
    assert ("Last is not one step for every run: the final evaluated step is 20, but some "
            "seeds of GRPO (from step 10) end earlier (a missing evaluation)") in text
    assert "Last is not one step" not in _verdict(_sweep(tmp_path / "even",
                                                         {"DAPO": (0.2, 0.3, 0.25),
                                                          "GRPO": (0.3, 0.4, 0.35)}))


def test_two_seeds_write_an_honest_report(tmp_path):
    """2 seeds: 1 df, so the detectable size's upper end passes the scale; said so."""
    root = _sweep(tmp_path, {"DAPO": (0.25, 0.35), "GRPO": (0.30, 0.50)})
    text = _verdict(root)
    assert "2 seed(s) per method" in text
    assert "more than the scale allows" in text
