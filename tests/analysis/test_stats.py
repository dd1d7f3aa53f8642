"""Seed intervals, the paired t over seeds, Holm, and the old bootstrap, against hand-computed
cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.stats import (
    bootstrap_means,
    clip_interval,
    holm,
    outside,
    paired_t,
    problem_bootstrap,
    seed_delta,
    seed_interval,
    t_quantile,
)


def test_t_quantiles_match_their_closed_forms():
    # 1 degree of freedom is the Cauchy distribution: t = tan(pi * (0.975 - 0.5))
    assert t_quantile(2) == pytest.approx(math.tan(0.475 * math.pi), rel=1e-12)
    # 2 degrees of freedom: F(t) = 1/2 + t / (2 sqrt(2 + t^2)) = 0.975
    #   -> t^2 = 2 * 0.95^2 / (1 - 0.95^2)
    assert t_quantile(3) == pytest.approx(math.sqrt(2 * 0.9025 / 0.0975), rel=1e-12)
    assert t_quantile(3) == pytest.approx(4.3027, abs=1e-4)  # any printed t table
    with pytest.raises(ValueError, match="at least 2"):
        t_quantile(1)


def test_seed_interval_by_hand():
    # 0.4, 0.5, 0.6: mean 0.5, sample sd 0.1, se 0.1 / sqrt(3), half-width t(0.975, 2) * se
    s = seed_interval([0.4, 0.5, 0.6])
    se = 0.1 / math.sqrt(3)
    half = math.sqrt(2 * 0.9025 / 0.0975) * se
    assert s.k == 3 and s.mean == pytest.approx(0.5, rel=1e-12)
    assert s.se == pytest.approx(se, rel=1e-12)
    assert (s.low, s.high) == (pytest.approx(0.5 - half, rel=1e-12), pytest.approx(0.5 + half, rel=1e-12))
    # two seeds 0.2, 0.4: se = |0.4 - 0.2| / 2 = 0.1, interval 0.3 ± tan(0.475 pi) * 0.1
    two = seed_interval([0.2, 0.4])
    assert two.se == pytest.approx(0.1, rel=1e-12)
    assert two.high - two.mean == pytest.approx(math.tan(0.475 * math.pi) * 0.1, rel=1e-12)


def test_one_seed_has_no_spread():
    s = seed_interval([0.7])
    assert s.mean == 0.7 and s.k == 1
    assert math.isnan(s.se) and math.isnan(s.low) and math.isnan(s.high)
    with pytest.raises(ValueError, match="non-empty"):
        seed_interval([])
    with pytest.raises(ValueError, match="finite"):
        seed_interval([0.1, float("nan")])


def test_seed_interval_is_clipped_to_the_range_of_the_quantity():
    # KLs 2, 5, 23 (mean 10, sd 11.36): the t interval reaches below 0, a KL cannot
    free = seed_interval([2.0, 5.0, 23.0])
    kl = seed_interval([2.0, 5.0, 23.0], bounds=(0.0, math.inf))
    assert free.low < 0 and kl.low == 0.0 and kl.high == free.high and kl.mean == 10.0
    acc = seed_interval([0.9, 0.99, 1.0], bounds=(0.0, 1.0))
    assert acc.high == 1.0 and acc.low == seed_interval([0.9, 0.99, 1.0]).low


def test_seed_delta_averages_problems_inside_a_seed_then_takes_the_t_over_seeds():
    # seed 0: diffs (0.5, 0, 0.25) -> 0.25; seed 1: (0, 0, 0) -> 0; seed 2: (0.5, 0.5, 0.5)
    # -> 0.5. Δ_s = 0.25, 0, 0.5: mean 0.25, sd 0.25, se 0.25/sqrt(3)
    m = [[0.75, 0.5, 0.5], [0.25, 0.0, 1.0], [1.0, 0.5, 0.75]]
    b = [[0.25, 0.5, 0.25], [0.25, 0.0, 1.0], [0.5, 0.0, 0.25]]
    d = seed_delta(m, b)
    half = math.sqrt(2 * 0.9025 / 0.0975) * 0.25 / math.sqrt(3)
    assert (d.delta, d.seeds, d.problems) == (pytest.approx(0.25), 3, 3)
    assert (d.low, d.high) == (pytest.approx(0.25 - half), pytest.approx(0.25 + half))
    assert d.sd == pytest.approx(0.25)
    # t = 0.25 / (0.25/sqrt(3)) = sqrt(3) on 2 df: F(t) = 1/2 + t / (2 sqrt(2 + t^2))
    assert d.p == pytest.approx(2 * (0.5 - math.sqrt(3) / (2 * math.sqrt(5))), rel=1e-12)
    assert d.verdict == "tie"


def test_the_pairs_of_one_seed_are_one_unit_not_many():
    """The old bootstrap counts 3 x 40 pairs; the run is the unit: 3 per-seed differences
    that disagree in sign give no separation however many problems each holds."""
    rng = np.random.default_rng(0)
    shift = np.array([0.08, -0.05, 0.06])  # one run's luck moves all its problems
    base = rng.uniform(0.2, 0.6, (3, 40))
    method = np.clip(base + shift[:, None], 0, 1)
    _, low, high = problem_bootstrap(method, base, reps=2000)
    assert low > 0  # 120 "independent" pairs: a separation
    assert seed_delta(method, base).verdict == "tie"


def test_one_seed_gives_a_delta_without_an_interval():
    d = seed_delta([[0.5, 1.0]], [[0.25, 0.25]])
    assert d.delta == 0.5 and d.seeds == 1 and d.problems == 2
    assert math.isnan(d.low) and math.isnan(d.high) and math.isnan(d.p) and d.verdict == "tie"


def test_constant_per_seed_differences_are_not_tested():
    # no spread: t is infinite (or 0/0), which is no evidence; no interval, no p value
    up = paired_t([0.25, 0.25, 0.25])
    assert math.isnan(up.low) and math.isnan(up.high) and math.isnan(up.p)
    assert (up.delta, up.sd, up.seeds, up.verdict, up.state) == (0.25, 0.0, 3, "tie", "constant")
    zero = paired_t([0.0, 0.0])
    assert math.isnan(zero.p) and zero.state == "nothing to test"
    # last bits of a sum in another order are still constant; a real spread is tested
    assert paired_t([0.1 + 0.2, 0.3, 0.3]).state == "constant"
    assert paired_t([0.25, 0.25, 0.25 + 1 / 484]).state == "tested"
    assert paired_t([0.25]).state == "one seed"


def test_a_clipped_interval_stays_ordered_and_keeps_its_mean_visible():
    kl = seed_interval([-0.02, -0.01, -0.015], bounds=(0.0, math.inf))
    assert kl.low <= kl.high and (kl.low, kl.high) == (0.0, 0.0)  # was low 0, high -0.0026
    assert kl.mean == pytest.approx(-0.015) and outside(kl.mean, kl.low, kl.high)
    inside = seed_interval([0.1, 0.2, 0.3], bounds=(0.0, math.inf))
    assert not outside(inside.mean, inside.low, inside.high)
    assert clip_interval(-0.5, 1.5, (0.0, 1.0)) == (0.0, 1.0)
    assert clip_interval(1.2, 1.5, (0.0, 1.0)) == (1.0, 1.0)


def test_seed_delta_is_antisymmetric_and_rejects_misaligned_input():
    rng = np.random.default_rng(1)
    a, b = rng.random((4, 10)), rng.random((4, 10))
    ab, ba = seed_delta(a, b), seed_delta(b, a)
    assert ba.delta == pytest.approx(-ab.delta) and ba.p == pytest.approx(ab.p)
    assert (ba.low, ba.high) == (pytest.approx(-ab.high), pytest.approx(-ab.low))
    with pytest.raises(ValueError, match="same non-zero number of seeds"):
        seed_delta(a, b[:3])
    with pytest.raises(ValueError, match="seed 1: per-problem scores must align"):
        seed_delta([[0.1], [0.1, 0.2]], [[0.1], [0.1]])


def test_holm_by_hand():
    # p = 0.01, 0.04, 0.03, 0.2 (K = 4): sorted 0.01, 0.03, 0.04, 0.2 -> 4*0.01 = 0.04,
    # 3*0.03 = 0.09, 2*0.04 = 0.08 -> running max 0.09, 1*0.2 = 0.2
    got = holm([0.01, 0.04, 0.03, 0.2])
    assert got == pytest.approx([0.04, 0.09, 0.09, 0.2])
    # NaN is no comparison: K = 2 here, and it stays NaN; adjusted p never exceeds 1
    got = holm([0.3, math.nan, 0.6])
    assert got[0] == pytest.approx(0.6) and math.isnan(got[1]) and got[2] == pytest.approx(0.6)
    assert holm([0.9, 0.8])[0] == 1.0


def test_old_bootstrap_of_two_pairs_takes_only_its_three_possible_means():
    # diffs 0 and 1: a resample of two pairs has mean 0, 1/2 or 1 with chances 1/4, 1/2, 1/4
    means = bootstrap_means([0.0, 1.0], reps=4000, seed=7)
    assert set(np.unique(means)) == {0.0, 0.5, 1.0}
    share = {v: float(np.mean(means == v)) for v in (0.0, 0.5, 1.0)}
    assert share[0.0] == pytest.approx(0.25, abs=0.03) and share[0.5] == pytest.approx(0.5, abs=0.03)
    # each end of the 95% interval sits inside a 25% atom, so it is exactly 0 and exactly 1
    assert problem_bootstrap([0.0, 1.0], [0.0, 0.0], reps=4000, seed=7) == (0.5, 0.0, 1.0)


def test_old_bootstrap_interval_of_four_pairs_by_hand():
    # diffs 0, 0, 0, 1: the resampled mean is K/4 with K ~ Binomial(4, 1/4).
    # P(K = 0) = 81/256 = 31.6% > 2.5%            -> the 2.5% quantile is 0
    # P(K = 4) = 1/256 = 0.4% < 2.5% < P(K >= 3) = 13/256 = 5.1%  -> the 97.5% quantile is 3/4
    got = problem_bootstrap([0.5, 0.5, 0.5, 1.0], [0.5, 0.5, 0.5, 0.0], reps=10_000, seed=0)
    assert got == (0.25, 0.0, 0.75)


def test_bad_bootstrap_inputs_are_rejected():
    with pytest.raises(ValueError, match="align"):
        problem_bootstrap([0.1, 0.2], [0.1])
    with pytest.raises(ValueError, match="reps"):
        problem_bootstrap([0.1], [0.1], reps=0)
    with pytest.raises(ValueError, match="non-empty"):
        problem_bootstrap([], [])


def test_bootstrap_of_many_pairs_is_drawn_in_chunks_with_the_same_law():
    """2,000 pairs x 10,000 resamples would be 160 MB of indices at once; drawn in chunks
    the means still have the bootstrap's law: mean = the sample mean, sd = sd(diffs)/sqrt(n)."""
    diffs = np.tile([0.0, 1.0], 1000)  # sd 0.5 (ddof=0), n = 2000
    means = bootstrap_means(diffs, reps=10_000, seed=0)
    assert means.shape == (10_000,)
    assert means.mean() == pytest.approx(0.5, abs=0.001)
    assert means.std() == pytest.approx(0.5 / math.sqrt(2000), rel=0.03)
    assert len(np.unique(means[:2000])) > 50  # not one chunk repeated
    assert not np.array_equal(means[:2000], means[2000:4000])
