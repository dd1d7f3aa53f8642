"""The KL to the initial model downstream of the evaluation: collect, the KL column of the
Last/Best tables, the frontier points and plots, the report section (numbers by hand)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from analysis_fixtures import write_run

from analysis.collect import collect, collect_initial
from analysis.frontier import checkpoint_points, design_points, write_frontier_plots
from analysis.plots import method_colors
from analysis.report import build_report, check_options
from analysis.tables import last_best_table, render_latex, render_markdown

# run_id: (label, seed, tags, {step: (toy accuracy, k1)})
RUNS = {
    "urkl_b0_s0": ("RPG-URKL [beta0]", 0, {"method": "RPG-URKL", "beta": "0"},
                   {10: (0.50, 0.20), 20: (0.40, 0.60)}),
    "urkl_b0_s1": ("RPG-URKL [beta0]", 1, {"method": "RPG-URKL", "beta": "0"},
                   {10: (0.30, 0.40), 20: (0.60, 0.80)}),
    "urkl_b1_s0": ("RPG-URKL [beta1]", 0, {"method": "RPG-URKL", "beta": "1"},
                   {10: (0.25, 0.05), 20: (0.30, 0.10)}),
    "urkl_b1_s1": ("RPG-URKL [beta1]", 1, {"method": "RPG-URKL", "beta": "1"},
                   {10: (0.35, 0.05), 20: (0.50, 0.20)}),
}


def _kl_block(k1: float) -> dict:
    return {"reference": "results/x/model", "reference_sha256": "2" * 64, "temperature": 1.0,
            "top_p": 1.0, "kl_to_initial_k1": k1, "kl_to_initial_k1_stderr": 0.01,
            "kl_to_initial_k3": k1 + 0.001, "kl_to_initial_k3_stderr": 0.01, "num_samples": 20}


def _write(root, runs=RUNS, initial_acc: float | None = 0.2):
    for run_id, (label, seed, tags, by_step) in runs.items():
        run = write_run(root / "runs", run_id, label, seed, tags,
                        evals={"toy": {s: acc for s, (acc, _) in by_step.items()}})
        for step, (_, k1) in by_step.items():
            path = run / "eval" / f"step_{step}" / "toy.json"
            summary = json.loads(path.read_text())
            path.write_text(json.dumps({**summary, "kl_to_initial": _kl_block(k1)}))
    if initial_acc is not None:
        write_run(root, "initial", "initial", 0, {}, evals={"toy": {0: initial_acc}})
    return root


@pytest.fixture
def kl_sweep(tmp_path):
    return _write(tmp_path / "sweep")


def test_collect_reads_the_kl_and_leaves_nan_without_one(kl_sweep, tmp_path):
    ev = collect(kl_sweep).eval
    row = ev[(ev.run_id == "urkl_b0_s1") & (ev.step == 20) & (ev.scorer == "dapo")].iloc[0]
    assert row["kl_to_initial_k1"] == 0.80 and row["kl_to_initial_k3"] == pytest.approx(0.801)
    plain = tmp_path / "plain"
    write_run(plain / "runs", "r_s0", "R", 0, {}, evals={"toy": {10: 0.5}})
    assert collect(plain).eval["kl_to_initial_k1"].isna().all()


def test_the_table_puts_the_last_checkpoints_kl_beside_last(kl_sweep):
    tidy = last_best_table(collect(kl_sweep).eval, "dapo")
    b0 = tidy[(tidy.label == "RPG-URKL [beta0]")].set_index("stat")
    # Last (step 20) KLs 0.6, 0.8: mean 0.7, se = std(ddof 1) / sqrt 2 = 0.1
    assert b0.loc["last", "kl"] == pytest.approx(0.7)
    assert b0.loc["last", "kl_se"] == pytest.approx(0.1)
    # Best: seed 0 peaks at step 10 (KL 0.2), seed 1 at step 20 (KL 0.8)
    assert b0.loc["best", "kl"] == pytest.approx(0.5)
    md = render_markdown(tidy)
    header = next(line for line in md.splitlines() if line.startswith("| Method"))
    cells = [c.strip() for c in header.strip("|").split("|")]
    assert cells[1:4] == ["Toy Last", "KL Toy Last", "Toy Best"]
    # the seed interval too: 0.7 +- t(0.975, 1) * 0.1 = 0.7 +- 1.2706, clipped at 0: a KL
    # cannot be negative (its k1 estimate can, the quantity cannot)
    assert "| RPG-URKL [beta0] |" in md and "0.700 ± 0.100 [0.000, 1.971]" in md
    assert b0.loc["last", "kl_ci95_low"] == 0.0
    assert "KL Last = KL(pi_ckpt || pi_init)" in md
    tex = render_latex(tidy, "t")
    assert "& Last & KL Last & Best \\\\" in tex and "0.700 $\\pm$ 0.100" in tex


def test_a_table_without_kl_has_no_kl_column(tmp_path):
    write_run(tmp_path / "runs", "r_s0", "R", 0, {}, evals={"toy": {10: 0.5}})
    md = render_markdown(last_best_table(collect(tmp_path).eval, "dapo"))
    assert "KL" not in md


def test_checkpoint_points_average_seeds_and_start_at_the_initial_model(kl_sweep):
    points = checkpoint_points(collect(kl_sweep).eval, "dapo", collect_initial(kl_sweep))
    b1 = points[points.label == "RPG-URKL [beta1]"].set_index("step")
    assert list(b1.index) == [0, 10, 20]
    assert b1.loc[0, "kl"] == 0.0 and b1.loc[0, "acc"] == pytest.approx(0.2)
    assert b1.loc[20, "acc"] == pytest.approx(0.40) and b1.loc[20, "kl"] == pytest.approx(0.15)
    assert b1.loc[20, "kl_se"] == pytest.approx(0.05)  # KLs 0.1, 0.2
    assert b1.loc[10, "kl_se"] == 0.0


def test_design_points_take_each_runs_last_checkpoint_per_beta(kl_sweep):
    d = design_points(collect(kl_sweep).eval, "dapo").set_index("beta")
    assert list(d.index) == [0.0, 1.0]
    assert d.loc[0.0, "acc"] == pytest.approx(0.5) and d.loc[0.0, "kl"] == pytest.approx(0.7)
    # 95% t interval over two seeds: mean ± t(0.975, 1) * se, t = 12.706
    assert d.loc[0.0, "kl_high"] == pytest.approx(0.7 + 12.7062047 * 0.1, rel=1e-6)
    one_beta = {k: v for k, v in RUNS.items() if "_b0_" in k}
    assert design_points(collect(_write(kl_sweep.parent / "one", one_beta)).eval, "dapo").empty


def test_frontier_figures_and_report_section(kl_sweep):
    ev = collect(kl_sweep).eval
    written = write_frontier_plots(ev, kl_sweep / "plots", method_colors(ev["label"]),
                                   collect_initial(kl_sweep))
    assert set(written) == {"frontier_dapo", "frontier_math_verify", "frontier_designs_dapo",
                            "frontier_designs_math_verify"}
    assert all(p.stat().st_size > 1000 for paths in written.values() for p in paths)
    report = build_report(check_options(kl_sweep, kl_sweep))
    text = report.read_text()
    assert "## Reward-KL frontier" in text and "plots/frontier_designs_dapo.png" in text


def test_no_frontier_without_kl(tmp_path):
    write_run(tmp_path / "runs", "r_s0", "R", 0, {}, evals={"toy": {10: 0.5}})
    ev = collect(tmp_path).eval
    assert write_frontier_plots(ev, tmp_path / "plots", method_colors(ev["label"])) == {}
    assert math.isnan(pd.to_numeric(ev["kl_to_initial_k1"]).iloc[0])
