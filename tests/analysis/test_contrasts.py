"""`analysis.contrasts` and the report's contrast paragraph, on hand-made overlays: the
pairs found from labels, accuracy Δ and KL Δ with their intervals and detectable sizes by
hand (paired by seed), separation stated only where an interval excludes 0, and whether it
survives Holm's adjustment over the overlay's accuracy and KL comparisons."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from analysis_fixtures import per_problem, write_run
from scipy import stats

from analysis import power
from analysis.__main__ import main
from analysis.contrasts import kl_mdd, kl_seeds_needed, pairs, sweep_contrasts
from analysis.report import build_report, check_options
from analysis.stats import holm, seed_delta
from analysis.verdict import contrast_paragraph

# (label, toy Mean@4 at Last per seed, KL at Last per seed)
FRONTIER = {
    "GRPO [beta1 ref-fixed]": ((0.30, 0.30, 0.30), (0.40, 0.45, 0.50)),
    "GRPO-ISKL [beta1 ref-fixed]": ((0.30, 0.30, 0.30), (0.70, 0.72, 0.83)),
    "GRPO [beta0.1 ref-fixed]": ((0.50, 0.40, 0.45), (1.0, 1.5, 0.9)),
    "GRPO-ISKL [beta0.1 ref-fixed]": ((0.45, 0.45, 0.45), (1.1, 1.2, 1.2)),
    "RPG-URKL [beta1 ref-fixed]": ((0.35, 0.35, 0.35), (0.5, 0.5, 0.5)),  # no twin
}


def _write(root, cells):
    for i, (label, (means, kls)) in enumerate(cells.items()):
        for seed, (mean, kl) in enumerate(zip(means, kls)):
            write_run(root / "runs", f"cell{i}_s{seed}", label, seed, {},
                      evals={"toy": {20: mean}}, kls={"toy": {20: kl}})
    return root


def test_pairs_come_from_the_labels():
    labels = [*FRONTIER, "DAPO [stale0]", "DAPO [stale2]", "DAPO [stale1]", "GRPO [stale1]",
              "DAPO [full]", "DAPO [lora-r1-lr1e-3]", "GRPO [lora-r8-lr1e-3]"]
    got = {(p.contrast, p.label, p.partner) for p in pairs(labels)}
    assert got == {
        ("method", "GRPO [beta1 ref-fixed]", "GRPO-ISKL [beta1 ref-fixed]"),
        ("method", "GRPO [beta0.1 ref-fixed]", "GRPO-ISKL [beta0.1 ref-fixed]"),
        ("stale", "DAPO [stale1]", "DAPO [stale0]"),
        ("stale", "DAPO [stale2]", "DAPO [stale0]"),
        ("lora", "DAPO [lora-r1-lr1e-3]", "DAPO [full]"),
    }  # GRPO [stale1] has no GRPO [stale0], GRPO [lora-...] no GRPO [full]; RPG-URKL no twin
    assert pairs(["DAPO", "GRPO"]) == []


def test_accuracy_and_kl_by_hand(tmp_path):
    rows = sweep_contrasts(_write(tmp_path, FRONTIER), delta=0.03, kl_delta=0.2)
    beta1 = rows[rows["label"] == "GRPO [beta1 ref-fixed]"].iloc[0]
    # KL: per-seed differences -0.30, -0.27, -0.33: mean -0.30, sd 0.03, t(2) interval
    d = np.array([0.40 - 0.70, 0.45 - 0.72, 0.50 - 0.83])
    half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / math.sqrt(3)
    assert beta1.kl_delta == pytest.approx(d.mean())
    assert (beta1.kl_low, beta1.kl_high) == pytest.approx((d.mean() - half, d.mean() + half))
    assert beta1.kl_p == pytest.approx(2 * stats.t.sf(abs(d.mean()) / (d.std(ddof=1) / 3 ** .5), 2))
    assert beta1.kl_high < 0  # separates: GRPO ends nearer the reference
    assert beta1.kl_mdd == pytest.approx(power.t_mdd(d.std(ddof=1), 3))
    # accuracy equal on every problem and seed: Δ 0 with nothing to test (no interval, no p
    # value, not in K); what could have been detected is still bounded by the sampling
    # noise of Mean@4 (the `within` component)
    assert beta1.delta == 0 and math.isnan(beta1.delta_low) and math.isnan(beta1.delta_high)
    assert math.isnan(beta1.delta_p) and math.isnan(beta1.delta_p_holm)
    assert (beta1.delta_seeds, beta1.delta_problems) == (3, 5)
    same = np.array([per_problem(0.30)] * 3)
    assert beta1.mdd == pytest.approx(power.mdd(power.estimate(same, same, 4),
                                                power.Design(3, 5, 4)))
    beta01 = rows[rows["label"] == "GRPO [beta0.1 ref-fixed]"].iloc[0]
    m = [per_problem(mean) for mean in (0.50, 0.40, 0.45)]
    b = [per_problem(0.45)] * 3
    want = seed_delta(m, b)  # Δ_s = +0.05, -0.05, 0
    assert (beta01.delta, beta01.delta_low, beta01.delta_high, beta01.delta_p) == (
        pytest.approx(want.delta), want.low, want.high, want.p)
    comp = power.estimate(np.array(m), np.array(b), 4)
    assert beta01.mdd == pytest.approx(power.mdd(comp, power.Design(3, 5, 4)))
    assert beta01.seeds_for_delta == power.needed(comp, power.Design(3, 5, 4), 0.03)["seeds"]
    # KL: differences -0.1, +0.3, -0.3 straddle 0: not separated
    assert beta01.kl_low < 0 < beta01.kl_high
    assert beta01.seeds_for_kl_delta == kl_seeds_needed(np.std([-0.1, 0.3, -0.3], ddof=1), 0.2)
    # one family: the accuracy and KL p values, Holm-adjusted together; beta1's accuracy has
    # nothing to test (no p value), so K = 3
    ps = [*rows["delta_p"], *rows["kl_p"]]
    assert [*rows["delta_p_holm"], *rows["kl_p_holm"]] == pytest.approx(list(holm(ps)),
                                                                        nan_ok=True)
    assert beta1.kl_p_holm == pytest.approx(3 * beta1.kl_p)  # the smallest of K = 3


def test_kl_power_is_a_paired_t_test():
    assert math.isnan(kl_mdd(0.3, 1))  # one seed: no sd, nothing detectable
    assert kl_mdd(0.3, 10) < kl_mdd(0.3, 3)
    need = kl_seeds_needed(0.3, 0.2)
    assert kl_mdd(0.3, need) <= 0.2 < kl_mdd(0.3, need - 1)
    # simulated: a true Δ of kl_mdd is detected ~80% of the time by the t interval
    rng = np.random.default_rng(0)
    delta, hits = kl_mdd(0.3, 8), 0
    for _ in range(4000):
        d = rng.normal(delta, 0.3, 8)
        hits += abs(d.mean()) > stats.t.ppf(0.975, 7) * d.std(ddof=1) / math.sqrt(8)
    assert 0.77 < hits / 4000 < 0.83


def test_the_report_states_separation_with_intervals(tmp_path):
    root = _write(tmp_path, FRONTIER)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        md = build_report(check_options(root, root / "out")).read_text()
    paragraph = next(line for line in md.splitlines() if line.startswith("**Contrasts**"))
    rows = sweep_contrasts(root)
    assert paragraph == contrast_paragraph(rows)
    assert "3 seed(s) per cell" in paragraph
    beta1 = rows[rows["label"] == "GRPO [beta1 ref-fixed]"].iloc[0]
    assert ("GRPO [beta1 ref-fixed] vs GRPO-ISKL [beta1 ref-fixed]: accuracy +0.00 (nothing "
            f"to test; detectable {100 * beta1.mdd:.2f}), KL -0.300 [") in paragraph
    assert beta1.kl_p_holm < 0.05
    assert (f"KL -0.300 [{beta1.kl_low:+.3f}, {beta1.kl_high:+.3f}] (separated, a finding: "
            f"Holm p {beta1.kl_p_holm:.3f}; detectable {beta1.kl_mdd:.3f})") in paragraph
    assert "K = 3 comparisons (accuracy and KL)" in paragraph
    assert "GRPO [beta0.1 ref-fixed] vs GRPO-ISKL [beta0.1 ref-fixed]" in paragraph
    assert "## Contrasts" in md


def test_a_sweep_without_contrasts_has_no_paragraph(tmp_path, capsys):
    write_run(tmp_path / "runs", "dapo_s0", "DAPO", 0, {}, evals={"toy": {20: 0.4}})
    assert sweep_contrasts(tmp_path).empty and contrast_paragraph(sweep_contrasts(tmp_path)) == ""
    assert main(["contrasts", "--sweep-dir", str(tmp_path)]) == 0
    assert "no contrast" in capsys.readouterr().out


def test_cli_prints_the_table_and_the_seeds_each_target_needs(tmp_path, capsys):
    root = _write(tmp_path, FRONTIER)
    assert main(["contrasts", "--sweep-dir", str(root), "--delta", "3", "--kl-delta",
                 "0.2"]) == 0
    out = capsys.readouterr().out
    assert "| importance weight on GRPO's k3 term (GRPO vs GRPO-ISKL) | GRPO [beta1 " in out
    assert "GRPO [beta1 ref-fixed] vs GRPO-ISKL [beta1 ref-fixed]: seeds to detect 3 points: " in out
    assert main(["contrasts", "--sweep-dir", str(root), "--kl-delta", "0"]) == 2
