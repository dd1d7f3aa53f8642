"""pass@k and maj@k beside Mean@n at Last (analysis.atk), for the warm start and each
method: the real-model snapshot's gain is mostly sharpening, pass@4 54 -> 61 while Mean@4
36 -> 50."""

from __future__ import annotations

from pathlib import Path

from analysis.atk import at_k_markdown
from analysis.snapshot import read_published

REPO = Path(__file__).resolve().parents[2]


def test_the_real_model_shows_pass_and_maj_at_k_beside_mean_for_warm_start_and_methods():
    evals, _, initial = read_published(REPO / "docs" / "runs" / "real-cpu")
    text = at_k_markdown(evals, initial, "math_verify_boxed")
    arithmetic = text.split("*Arithmetic")[1]
    assert "| Model | Mean@n | Pass@4 | Maj@4 |" in arithmetic
    assert "| warm start (step 0) | 36.00 | 54.00 | 38.00 |" in arithmetic
    assert "| DAPO | 50.25 | 60.67 | 50.67 |" in arithmetic
    assert "| RPG-REINFORCE-URKL | 49.92 | 61.00 | 51.67 |" in arithmetic
    report = (REPO / "docs" / "runs" / "real-cpu" / "report.md").read_text()
    assert "## pass@k and maj@k at Last" in report and text.rstrip("\n") in report


def test_nothing_without_k_columns():
    evals, _, initial = read_published(REPO / "docs" / "runs" / "real-cpu")
    bare = evals.drop(columns=[c for c in evals.columns if "_at_" in c])
    assert at_k_markdown(bare, initial, "math_verify_boxed") == ""


def test_a_greedy_column_where_the_sweep_evaluated_greedily():
    """eval.greedy's accuracy gets a column: each method's mean over seeds at Last and the
    warm start's; a model without it shows "–"; a sweep without it has no column."""
    evals, _, initial = read_published(REPO / "docs" / "runs" / "real-cpu")
    evals = evals.copy()
    dapo = evals["label"] == "DAPO"
    evals["greedy"] = float("nan")
    evals.loc[dapo, "greedy"] = evals.loc[dapo, "seed"].map({0: 0.50, 1: 0.55, 2: 0.60})
    initial = initial.assign(greedy=0.40)
    arithmetic = at_k_markdown(evals, initial, "math_verify_boxed").split("*Arithmetic")[1]
    assert "| Model | Mean@n | Pass@4 | Maj@4 | Greedy |" in arithmetic
    assert "| warm start (step 0) | 36.00 | 54.00 | 38.00 | 40.00 |" in arithmetic
    assert "| DAPO | 50.25 | 60.67 | 50.67 | 55.00 |" in arithmetic
    assert "| RPG-REINFORCE-URKL | 49.92 | 61.00 | 51.67 | – |" in arithmetic
    no_greedy = at_k_markdown(evals.drop(columns="greedy"), initial, "math_verify_boxed")
    assert "Greedy" not in no_greedy
