"""Seed intervals and the paired bootstrap against hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.stats import (
    PairedDelta,
    bootstrap_means,
    paired_bootstrap,
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


def test_bootstrap_of_two_pairs_takes_only_its_three_possible_means():
    # diffs 0 and 1: a resample of two pairs has mean 0, 1/2 or 1 with chances 1/4, 1/2, 1/4
    means = bootstrap_means([0.0, 1.0], reps=4000, seed=7)
    assert set(np.unique(means)) == {0.0, 0.5, 1.0}
    share = {v: float(np.mean(means == v)) for v in (0.0, 0.5, 1.0)}
    assert share[0.0] == pytest.approx(0.25, abs=0.03) and share[0.5] == pytest.approx(0.5, abs=0.03)
    # each end of the 95% interval sits inside a 25% atom, so it is exactly 0 and exactly 1
    d = paired_bootstrap([0.0, 1.0], [0.0, 0.0], reps=4000, seed=7)
    assert d == PairedDelta(delta=0.5, low=0.0, high=1.0, pairs=2)


def test_bootstrap_interval_of_four_pairs_by_hand():
    # diffs 0, 0, 0, 1: the resampled mean is K/4 with K ~ Binomial(4, 1/4).
    # P(K = 0) = 81/256 = 31.6% > 2.5%            -> the 2.5% quantile is 0
    # P(K = 4) = 1/256 = 0.4% < 2.5% < P(K >= 3) = 13/256 = 5.1%  -> the 97.5% quantile is 3/4
    d = paired_bootstrap([0.5, 0.5, 0.5, 1.0], [0.5, 0.5, 0.5, 0.0], reps=10_000, seed=0)
    assert d.delta == 0.25  # (0 + 0 + 0 + 1) / 4
    assert (d.low, d.high, d.pairs) == (0.0, 0.75, 4)
    assert d.verdict == "tie"  # the interval touches 0


def test_constant_differences_give_a_point_interval_and_a_verdict():
    up = paired_bootstrap([0.5, 0.75, 1.0], [0.25, 0.5, 0.75], reps=100, seed=1)
    assert (up.delta, up.low, up.high) == (0.25, 0.25, 0.25) and up.verdict == "better"
    down = paired_bootstrap([0.25, 0.5, 0.75], [0.5, 0.75, 1.0], reps=100, seed=1)
    assert down.verdict == "worse"


def test_bootstrap_is_deterministic_given_the_seed_and_antisymmetric():
    rng = np.random.default_rng(123)
    a, b = rng.random(30), rng.random(30)
    first = paired_bootstrap(a, b, reps=500, seed=3)
    assert paired_bootstrap(a, b, reps=500, seed=3) == first
    assert paired_bootstrap(a, b, reps=500, seed=4) != first
    flipped = paired_bootstrap(b, a, reps=500, seed=3)
    assert flipped.delta == pytest.approx(-first.delta)
    assert (flipped.low, flipped.high) == (pytest.approx(-first.high), pytest.approx(-first.low))


def test_bad_bootstrap_inputs_are_rejected():
    with pytest.raises(ValueError, match="align"):
        paired_bootstrap([0.1, 0.2], [0.1])
    with pytest.raises(ValueError, match="reps"):
        paired_bootstrap([0.1], [0.1], reps=0)
    with pytest.raises(ValueError, match="non-empty"):
        paired_bootstrap([], [])


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
