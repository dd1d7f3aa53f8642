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
