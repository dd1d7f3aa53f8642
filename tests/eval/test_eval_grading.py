"""Scorer tests: DAPO quirks vs math-verify, failure statuses, timeouts, hostile input."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.grading import (
    DAPO_TAIL_CHARS,
    STATUSES,
    GradeResult,
    MathVerifyPool,
    default_workers,
    grade,
    grade_many,
    last_boxed,
    normalize_final_answer,
)

# (completion, gold, dapo correct, math_verify correct). The rows where the two disagree
# are the reason both scorers are reported side by side.
REGRESSION = [
    ("The answer follows.\nAnswer: 540", "540", True, True),
    ("Answer: 540.", "540", False, True),  # DAPO keeps the trailing period
    ("**Answer:** 540", "540", False, True),  # bold markers stay in the DAPO extraction
    ("So the result is \\boxed{540}.", "540", False, True),  # DAPO reads only "Answer:"
    ("Answer: 033", "33", False, True),  # leading zero: string vs number
    ("Answer: 336^\\circ", "336", True, True),  # "^\circ" is a Minerva deletion
    ("Answer: $336^{\\circ}$", "336", True, True),
    ("Answer: $540.$", "540", True, True),  # ".$" -> "$" is a Minerva substitution
    ("Answer: 1,000", "1000", True, True),
    ("Answer: \\frac{1}{2}", "0.5", False, True),  # no numeric equivalence in DAPO
    ("Answer: x = 7", "7", True, True),  # DAPO keeps what follows the last "="
    ("answer:   12 dollars", "12", True, True),
    ("Answer: 5\nAnswer: 6", "6", True, True),  # the last "Answer:" line counts
    ("Answer: 41", "42", False, False),
]


@pytest.mark.parametrize(("completion", "gold", "dapo", "mv"), REGRESSION)
def test_regression_table(completion, gold, dapo, mv):
    assert grade(completion, gold, "dapo").correct is dapo
    assert grade(completion, gold, "math_verify").correct is mv


# (completion, gold, math_verify correct, math_verify_boxed result): math-verify alone reads
# answers a small model never boxed (the first two are SmolLM2-135M-Instruct's own text);
# the boxed scorer reads the last \\boxed{} and nothing else.
BOXED = [
    ("So the final answer is 41 + 16 = 172.", "57", True, GradeResult(False, None, "no_answer")),
    ("18 + 21 = 39", "39", True, GradeResult(False, None, "no_answer")),
    ("So the answer is: \\boxed{72}", "83", False, GradeResult(False, "72", "ok")),
    ("18 + 21 = 39, so \\boxed{39}.", "39", True, GradeResult(True, "39", "ok")),
    ("\\boxed{3} at first, then \\boxed{\\frac{1}{2}}", "0.5", False,  # both boxes read
     GradeResult(True, "\\frac{1}{2}", "ok")),
    ("$\\boxed{540}$", "540", True, GradeResult(True, "540", "ok")),
    ("The answer is \\boxed{}. It is 39.", "39", True, GradeResult(False, None, "no_answer")),
    ("39 is \\boxed{39", "39", True, GradeResult(False, None, "no_answer")),  # never closed
]


@pytest.mark.parametrize(("completion", "gold", "mv", "boxed"), BOXED)
def test_the_boxed_scorer_reads_the_last_box_alone(completion, gold, mv, boxed):
    assert grade(completion, gold, "math_verify").correct is mv
    assert grade(completion, gold, "math_verify_boxed") == boxed


def test_last_boxed_matches_braces():
    assert last_boxed("\\boxed{\\frac{1}{2}} and \\boxed{x^{2}}") == "x^{2}"
    assert last_boxed("\\boxed{}") == "" and last_boxed("none") is None
    assert last_boxed("\\boxed{" * 2000 + "1" + "}" * 10) == "1"  # the last box opened
    assert last_boxed("\\boxed{1} \\boxed{2") is None  # the last box never closes


def test_dapo_extraction_and_status():
    assert grade("Answer: 540.", "540", "dapo") == GradeResult(False, "540.", "ok")
    assert grade("**Answer:** 540", "540", "dapo").extracted == "**540"
    assert grade("\\boxed{540}", "540", "dapo") == GradeResult(False, None, "no_answer")


def test_dapo_reads_only_the_last_300_characters():
    early = "Answer: 540\n" + "x" * DAPO_TAIL_CHARS
    assert grade(early, "540", "dapo").status == "no_answer"
    assert grade(early, "540", "math_verify").status == "ok"
    late = "x" * 10_000 + "\nAnswer: 540"
    assert grade(late, "540", "dapo").correct


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("$\\boxed{540}$", "540"),
        ("\\text{(A) }12", "(A)12"),
        ("\\frac12", "\\frac{1}{2}"),
        ("\\sqrt2", "\\sqrt{2}"),
        ("10 \\text{ cm}", "10"),
        ("1,234,567", "1234567"),
        ("1,2", "12"),  # a Minerva quirk: commas go whenever the rest is digits
        ("(1,2)", "(1,2)"),
        ("\\$5", "5"),
    ],
)
def test_minerva_normalization(raw, normalized):
    assert normalize_final_answer(raw) == normalized


def test_math_verify_statuses_and_gold_first():
    r = grade("Thus \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", "math_verify")
    assert (r.correct, r.status) == (True, "ok")
    assert grade("no math here at all", "5", "math_verify").status == "no_answer"


def test_grade_many_order_and_validation():
    comps = ["Answer: 1", "Answer: 2", "Answer: 3"]
    res = grade_many(comps, ["3", "2", "1"], "math_verify")
    assert [r.correct for r in res] == [False, True, False]
    assert [r.extracted for r in res] == ["1", "2", "3"]
    with pytest.raises(ValueError, match="2 completions but 1 golds"):
        grade_many(["a", "b"], ["1"], "dapo")
    with pytest.raises(ValueError, match="scorer='regex' is not registered"):
        grade("a", "1", "regex")
    with pytest.raises(TypeError, match="completion 0 is bytes"):
        grade_many([b"Answer: 1"], ["1"], "dapo")
    assert grade_many([], [], "math_verify") == []


HOSTILE = [
    "Answer: " + "9" * 1_000_000,  # 1 MB
    "x" * 500_000 + "\\boxed{" * 2000 + "1" + "}" * 10,  # deep, unbalanced braces
    "Answer: $9^9^9^9$",
    "\\boxed{9^{9^{9^{9}}}}",
    "Answer: \\frac{1}{\\left( 2",  # unbalanced LaTeX
    "\x00\xff\ufffd\ud800 junk \x1b[31m",  # binary junk, a lone surrogate
    "Answer: \uff15\uff14\uff10",  # full-width digits look like 540
    "Answer: \u0665\u0664\u0660",  # Arabic-Indic digits
    "Answer: __import__('os').system('touch /tmp/_eval_pwned')",
]


def test_hostile_completions_finish_within_the_limit():
    limit = 2.0
    start = time.monotonic()
    mv = grade_many(HOSTILE, ["540"] * len(HOSTILE), "math_verify", timeout_s=limit)
    mv += grade_many(HOSTILE, ["540"] * len(HOSTILE), "math_verify_boxed", timeout_s=limit)
    elapsed = time.monotonic() - start
    dapo = grade_many(HOSTILE, ["540"] * len(HOSTILE), "dapo")
    assert elapsed < 2 * limit * len(HOSTILE)
    for r in mv + dapo:
        assert r.status in STATUSES and not r.correct
    assert not Path("/tmp/_eval_pwned").exists()  # nothing from a completion is executed


def test_dapo_path_is_cheap_on_huge_input():
    start = time.perf_counter()
    grade_many(["Answer: 1" + "x" * 1_000_000] * 200, ["1"] * 200, "dapo")
    assert time.perf_counter() - start < 1.0


def test_timeout_kills_worker_and_pool_recovers():
    # math-verify (with its own timeouts off) hangs on this power tower; the pool must not.
    tower = "\\boxed{9^{9^{9^{9}}}}"
    start = time.monotonic()
    res = grade_many([tower, "Answer: 7"], ["540", "7"], "math_verify", timeout_s=1, workers=1)
    assert time.monotonic() - start < 30
    assert res == [GradeResult(False, None, "timeout"), GradeResult(True, "7", "ok")]
    # the replacement worker grades normally
    again = grade_many(["Answer: 7"], ["7"], "math_verify", timeout_s=10, workers=1)
    assert again[0].correct


def test_pool_size_follows_the_job_cpu_budget(monkeypatch):
    # Snakemake exports the rule's `threads:` as OMP_NUM_THREADS: one worker per 1-thread job.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert default_workers() == 1 and MathVerifyPool().workers == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert MathVerifyPool().workers == 3
    assert MathVerifyPool(workers=2).workers == 2  # an explicit count wins
    monkeypatch.setenv("OMP_NUM_THREADS", "junk")
    assert default_workers() == max(1, min(4, os.cpu_count() or 1))
    # the grades are the same whatever the pool's size
    comps, golds = [c for c, *_ in REGRESSION], [g for _, g, *_ in REGRESSION]
    assert (grade_many(comps, golds, "math_verify", workers=1)
            == grade_many(comps, golds, "math_verify", workers=2))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=400), st.sampled_from(["540", "33", "\\frac{1}{2}", "x^2"]))
def test_fuzz_both_scorers_never_raise(completion, gold):
    for scorer in ("dapo", "math_verify"):
        r = grade(completion, gold, scorer, timeout_s=10)
        assert r.status in STATUSES
        assert r.correct is False or r.status == "ok"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=2000), st.text(max_size=30))
def test_fuzz_dapo_is_consistent(completion, gold):
    r = grade(completion, gold, "dapo")
    if r.status == "ok":
        assert r.correct == (r.extracted == normalize_final_answer(gold))
    else:
        assert r.extracted is None and not r.correct
