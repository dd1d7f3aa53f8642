"""Accuracy by category on the generated arithmetic benchmark: each problem's operation comes
from its question (common.arithmetic.category), each run's Last scores are averaged inside
each category, then over seeds; the initial model's row comes from its own per-problem
scores; a benchmark without categories has no table."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.categories import INITIAL_LABEL, category_table, markdown, problem_categories
from analysis.delta import Scores
from common.arithmetic import category
from common.layout import INITIAL_DIR


def test_category_of_a_question():
    assert [category(q) for q in ("What is 12 + 30?", "What is 45 - 17?", "What is 3 * 14?")] \
        == ["addition", "subtraction", "multiplication"]
    with pytest.raises(ValueError, match="not an arithmetic question"):
        category("What is 12 / 3?")


def test_categories_of_the_held_out_pool():
    cats = problem_categories("arithmetic")
    counts = pd.Series(cats).value_counts().to_dict()
    assert counts == {"addition": 313, "subtraction": 254, "multiplication": 12}
    assert problem_categories("aime24") is None and problem_categories("toy") is None


def test_a_run_right_on_sums_and_wrong_on_differences():
    cats = problem_categories("arithmetic")
    rows = []
    for run_id, seed_offset in (("m_s0", 0), ("m_s1", 1)):
        for pid, cat in cats.items():
            # seed 0: every sum right; seed 1: every sum right but one sample in four of the
            # products; differences always wrong
            correct = {"addition": 4, "subtraction": 0, "multiplication": 4 - seed_offset}[cat]
            rows.append((run_id, 32, "arithmetic", "strict", pid, correct, 4))
    for pid, cat in cats.items():
        rows.append((INITIAL_DIR, 0, "arithmetic", "strict", pid, 2 if cat == "addition" else 0, 4))
    scores = Scores(pd.DataFrame(rows, columns=["run_id", "step", "benchmark", "scorer",
                                                "problem_id", "correct", "samples"]))
    per_run = pd.DataFrame({"run_id": ["m_s0", "m_s1"], "label": "M", "seed": [0, 1],
                            "benchmark": "arithmetic", "last_step": 32})
    table = category_table(per_run, scores, "strict", "arithmetic").set_index(["label",
                                                                               "category"])
    assert table.loc[("M", "addition"), "mean"] == 1.0
    assert table.loc[("M", "subtraction"), "mean"] == 0.0
    assert table.loc[("M", "multiplication"), "mean"] == pytest.approx(0.875)
    assert table.loc[("M", "multiplication"), "se"] == pytest.approx(0.125)
    assert table.loc[(INITIAL_LABEL, "addition"), "mean"] == 0.5
    assert table.loc[("M", "subtraction"), "problems"] == 254
    text = markdown(table.reset_index(), "strict", "arithmetic")
    assert "| Method | addition (313) | subtraction (254) | multiplication (12) |" in text
    assert "| M | 100.00 ± 0.00 | 0.00 ± 0.00 | 87.50 ± 12.50 |" in text
    assert "| Initial model (step 0) | 50.00 | 0.00 | 0.00 |" in text
    empty = category_table(per_run.assign(benchmark="toy"), scores, "strict", "toy")
    assert empty.empty
