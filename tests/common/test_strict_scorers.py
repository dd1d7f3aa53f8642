"""Strict scorers credit only the answer where the prompt asked for it (issue 51).

A policy trained on the lenient math-verify learned to restate the question ("32 + 48 = ?"):
math-verify reads any expression anywhere and evaluates it. These tests hold every scorer
registered as strict to anchored extraction, on restated-question answers written the way
SmolLM2 wrote them and on its real outputs (tests/data/smollm2_outputs.jsonl, read by hand).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common import _math_verify_worker as worker
from common.grading import SCORERS, grade, grade_many, strict_scorers

OUTPUTS = Path(__file__).resolve().parents[1] / "data" / "smollm2_outputs.jsonl"

# (completion, gold): the answer restates the question or states a wrong result, while a
# right-looking expression sits elsewhere in the text. None of them computed the answer.
RESTATED = [
    ("32 + 48 = ?", "80"),  # a trained seed's answer to "What is 32 + 48?"
    ("So the final answer is 41 + 16 = 172.", "57"),  # the warm start's own text
    ("12 \\times 2**9 = 32 + 48", "80"),  # the trained policy's real answer
    ("\\boxed{32 + 48}", "80"),  # the question boxed: sympy would evaluate it to 80
    ("The answer is \\boxed{32 + 48}.", "80"),
    ("\\boxed{? 80}", "80"),  # a bare number inside noise: read only without anchors
    ("80 is what 32 + 48 makes. The answer is \\boxed{}.", "80"),  # the box asked for is empty
    ("Answer: 32 + 48", "80"),
    ("Answer: 41 + 16 = ?\nIt is 57.", "57"),
]
# (completion, gold): the answer computed, in the place the prompt asked for.
COMPUTED = {
    "math_verify_boxed": [("23 + 14 = 37. The answer is \\boxed{37}.", "37"),
                          ("32 + 48 = \\boxed{80}", "80"), ("\\boxed{32 + 48 = 80}", "80"),
                          ("58 - 61 is \\boxed{-3}", "-3"), ("\\boxed{\\frac{1}{2}}", "0.5")],
    "dapo": [("32 + 48 = 80\nAnswer: 80", "80"), ("Answer: 41 + 16 = 57", "57")],
}


def test_each_scorer_declares_strict_or_lenient():
    assert {name: s.strict for name, s in SCORERS.items()} == {
        "dapo": True, "math_verify": False, "math_verify_boxed": True}
    assert set(COMPUTED) == set(strict_scorers())  # a new strict scorer brings its examples


@pytest.mark.parametrize(("completion", "gold"), RESTATED)
def test_no_strict_scorer_credits_a_restated_question(completion, gold):
    assert [s for s in strict_scorers() if grade(completion, gold, s).correct] == []


def test_the_lenient_scorer_credits_most_of_them():
    """Why it is lenient: the same answers, graded by math_verify, earn the reward."""
    credited = [c for c, g in RESTATED if grade(c, g, "math_verify").correct]
    assert len(credited) >= 6, credited


@pytest.mark.parametrize("name", sorted(COMPUTED))
def test_a_strict_scorer_credits_the_computed_answer(name):
    assert name in strict_scorers()
    results = grade_many(*zip(*COMPUTED[name]), name)
    assert all(r.correct for r in results), results


def test_math_verify_reads_only_the_box_when_strict():
    """The worker's anchored mode (`try_extract_without_anchor=False`, no fallback): the
    library's default reads the bare 80 in "\\boxed{? 80}"; the strict mode finds nothing."""
    assert worker.grade_one("\\boxed{? 80}", "80") == (True, "? 80", "ok")
    assert worker.grade_one("\\boxed{? 80}", "80", strict=True) == (False, None, "no_answer")
    # an expression equal to the gold is a restatement, not an answer, when the gold is a number
    assert worker.grade_one("\\boxed{32 + 48}", "80")[0]
    assert not worker.grade_one("\\boxed{32 + 48}", "80", strict=True)[0]
    assert worker.grade_one("\\boxed{x + 1}", "x + 1", strict=True)[0]  # not a number gold


def test_strict_scorers_on_the_models_own_text():
    """On 73 real SmolLM2 outputs, a strict scorer credits only an answer whose hand reading
    (its stated or its boxed answer) is right; the lenient one credits wrong ones."""
    rows = [json.loads(line) for line in OUTPUTS.read_text().splitlines()]
    texts, golds = [r["text"] for r in rows], [r["gold"] for r in rows]
    right = [r["stated_correct"] or r["boxed_correct"] for r in rows]
    for name in strict_scorers():
        credited = [r.correct for r in grade_many(texts, golds, name)]
        assert not any(c and not ok for c, ok in zip(credited, right)), name
    lenient = [r.correct for r in grade_many(texts, golds, "math_verify")]
    assert sum(c and not ok for c, ok in zip(lenient, right)) == 8
    # the boxed scorer agrees with the hand reading of the last box, row for row
    boxed = [r.correct for r in grade_many(texts, golds, "math_verify_boxed")]
    assert boxed == [r["boxed_correct"] for r in rows]
