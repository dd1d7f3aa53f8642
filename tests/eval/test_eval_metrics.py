"""Metric tests against hand-computed values and the closed forms."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.grading import GradeResult
from eval.metrics import (
    bootstrap_ci,
    ks_for,
    majority_correct,
    pass_at_k,
    summarize_scorer,
    truncation_rate,
)

OK_T = GradeResult(True, "5", "ok")


def g(extracted, correct=False, status="ok"):
    return GradeResult(correct, extracted, status)


@given(
    st.integers(1, 60).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))
    )
)
def test_pass_at_k_matches_closed_form(nck):
    n, c, k = nck
    expected = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_hand_values():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)  # 1 - C(2,2)/C(4,2) = 1 - 1/6
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 1, 4) == 1.0


def test_pass_at_k_rejects_k_above_n():
    with pytest.raises(ValueError, match="k=8 with only n=4"):
        pass_at_k(4, 1, 8)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(4, 5, 1)


def test_ks_for():
    assert ks_for(1) == [1]
    assert ks_for(32) == [1, 2, 4, 8, 16, 32]
    assert ks_for(6) == [1, 2, 4, 6]


def test_majority_vote():
    grades = [g("7", True), g("3"), g("3"), g(None, status="no_answer"), g("7", True), g("7", True)]
    assert majority_correct(grades, 1) is True
    assert majority_correct(grades, 3) is False  # "3" twice beats "7" once
    assert majority_correct(grades, 4) is False  # no_answer does not vote
    assert majority_correct(grades, 6) is True  # "7" x3 vs "3" x2
    assert majority_correct(grades[1:5], 4) is False  # "3" x2 vs "7" x1
    assert majority_correct([g("1", True), g("2")], 2) is True  # tie -> first seen
    assert majority_correct([g(None, status="no_answer")], 1) is False


def test_summarize_hand_computed():
    # 3 problems x 4 samples; per-problem accuracy 1/4, 2/4, 0/4
    p1 = [g("1", True), g("2"), g("2"), g(None, status="no_answer")]
    p2 = [g("5", True), g("5", True), g("6"), g(None, status="timeout")]
    p3 = [g("0"), g("0"), g("9"), g(None, status="error")]
    s = summarize_scorer([p1, p2, p3], seed=0)
    acc = [0.25, 0.5, 0.0]
    assert s["mean"] == pytest.approx(0.25)
    sd = math.sqrt(sum((a - 0.25) ** 2 for a in acc) / 2)
    assert s["mean_stderr"] == pytest.approx(sd / math.sqrt(3))
    assert s["pass_at_1"] == pytest.approx(0.25)
    # pass@2: p1 1-C(3,2)/C(4,2)=1/2, p2 1-C(2,2)/C(4,2)=5/6, p3 0
    assert s["pass_at_2"] == pytest.approx((0.5 + 5 / 6 + 0) / 3)
    assert s["pass_at_4"] == pytest.approx(2 / 3)
    # maj@4: p1 "2" wins (wrong), p2 "5" wins (right), p3 "0" wins (wrong)
    assert s["maj_at_4"] == pytest.approx(1 / 3)
    assert s["maj_at_1"] == pytest.approx(2 / 3)
    assert s["extract_fail_rate"] == pytest.approx(1 / 12)
    assert s["timeout_rate"] == pytest.approx(1 / 12)
    assert s["error_rate"] == pytest.approx(1 / 12)
    assert 0.0 <= s["mean_ci95_low"] <= s["mean"] <= s["mean_ci95_high"] <= 0.5
    assert summarize_scorer([p1, p2, p3], seed=0) == s  # seeded bootstrap


def test_summarize_custom_ks_and_errors():
    p = [[OK_T, OK_T]]
    assert {k for k in summarize_scorer(p, ks=[2]) if k.startswith("pass")} == {"pass_at_2"}
    with pytest.raises(ValueError, match="need 1 <= k <= n"):
        summarize_scorer(p, ks=[4])
    with pytest.raises(ValueError, match="same number"):
        summarize_scorer([[OK_T, OK_T], [OK_T]])
    with pytest.raises(ValueError, match="no problems"):
        summarize_scorer([])


def test_bootstrap_ci():
    assert bootstrap_ci([0.5] * 10, seed=1) == (0.5, 0.5)
    lo, hi = bootstrap_ci([0.0, 1.0] * 50, seed=1)
    assert lo < 0.5 < hi and hi - lo == pytest.approx(0.2, abs=0.06)  # ~ +-1.96 * 0.05
    assert bootstrap_ci([0.0, 1.0, 0.3], seed=3) == bootstrap_ci([0.0, 1.0, 0.3], seed=3)


def test_truncation_rate():
    assert truncation_rate(["stop", "length", "length", "stop"]) == 0.5
    with pytest.raises(ValueError):
        truncation_rate([])
