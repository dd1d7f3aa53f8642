"""Uncertainty of a sweep's numbers: spread over seeds, and paired differences to a baseline.

Two questions, two tools:

- *How much does a method's score move from seed to seed?* `seed_interval` gives the mean
  over seeds, its standard error (sample standard deviation with ddof=1, divided by sqrt(k))
  and a 95% interval `mean ± t(0.975, k-1) * se`. It is a Student-t interval, not the normal
  `± 1.96 se`, because a sweep has few seeds (3 by default): with k = 3 the t quantile is
  4.30, and the normal one would claim a far narrower interval than three draws support.
  The t interval assumes the per-seed scores are roughly normal; with one seed there is no
  spread to estimate and every uncertainty field is NaN (tables print "n/a").

- *Is a method better than the baseline (DAPO, the paper's main comparison)?*
  `paired_bootstrap` takes the differences `method - baseline` of per-problem Mean@n on the
  same problem and seed, resamples those (problem, seed) pairs with replacement `reps` times
  (numpy `Generator` seeded with `seed`: the same input and seed give the same interval),
  and reports the mean difference with a percentile interval of the resampled means. Pairing
  removes what both runs share (an easy problem is easy for both; seed s draws the same
  evaluation prompts for both), so the interval is much narrower than the difference of two
  independent intervals. It treats the pairs as exchangeable, which ignores that the pairs of
  one seed share a training run: read it as "would this difference survive other problems
  and other sampling noise", and the seed interval above as "other training seeds". With one
  seed the pairs are the problems alone and the bootstrap still works.

Values are fractions (0.25, not 25); rendering to percent is the tables' job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as _scipy_stats

LEVEL = 0.95
DEFAULT_REPS = 10_000
DEFAULT_SEED = 0


@dataclass(frozen=True)
class SeedInterval:
    """Mean over k seeds, its standard error and a t-based interval (NaN when k < 2)."""

    mean: float
    se: float
    low: float
    high: float
    k: int


def t_quantile(k: int, level: float = LEVEL) -> float:
    """The two-sided Student-t quantile for k values (k - 1 degrees of freedom)."""
    if k < 2:
        raise ValueError(f"a t interval needs at least 2 values, got {k}")
    return float(_scipy_stats.t.ppf(0.5 + level / 2, k - 1))


def seed_interval(values, level: float = LEVEL) -> SeedInterval:
    """Mean, standard error and `level` t-interval of per-seed scores (see module doc)."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or x.size == 0 or not np.isfinite(x).all():
        raise ValueError(f"seed_interval needs a non-empty 1-d array of finite numbers, got {x}")
    mean = float(x.mean())
    if x.size < 2:
        return SeedInterval(mean, math.nan, math.nan, math.nan, 1)
    se = float(x.std(ddof=1) / math.sqrt(x.size))
    half = t_quantile(x.size, level) * se
    return SeedInterval(mean, se, mean - half, mean + half, int(x.size))


@dataclass(frozen=True)
class PairedDelta:
    """Mean of paired differences, its bootstrap percentile interval, and the pair count."""

    delta: float
    low: float
    high: float
    pairs: int

    @property
    def verdict(self) -> str:
        """'better' / 'worse' when the interval excludes 0, else 'tie' (not distinguishable)."""
        if self.low > 0:
            return "better"
        if self.high < 0:
            return "worse"
        return "tie"


_CHUNK_DRAWS = 4_000_000  # indices drawn per Generator call: caps memory near 32 MB


def bootstrap_means(diffs, reps: int = DEFAULT_REPS, seed: int = DEFAULT_SEED) -> np.ndarray:
    """`reps` means of `len(diffs)` pairs drawn with replacement: one row of indices per
    rep, drawn in chunks of rows by one seeded Generator, so the result depends on (diffs,
    reps, seed) only."""
    d = np.asarray(diffs, dtype=float)
    if d.ndim != 1 or d.size == 0 or not np.isfinite(d).all():
        raise ValueError(f"bootstrap needs a non-empty 1-d array of finite differences, got {d}")
    if reps < 1:
        raise ValueError(f"bootstrap reps must be >= 1, got {reps}")
    rng = np.random.default_rng(seed)
    rows = max(1, _CHUNK_DRAWS // d.size)
    means = [
        d[rng.integers(0, d.size, size=(min(rows, reps - start), d.size))].mean(axis=1)
        for start in range(0, reps, rows)
    ]
    return np.concatenate(means)


def paired_bootstrap(
    method, baseline, reps: int = DEFAULT_REPS, seed: int = DEFAULT_SEED, level: float = LEVEL
) -> PairedDelta:
    """Δ = mean(method - baseline) over aligned pairs, with a percentile bootstrap interval.

    `method[i]` and `baseline[i]` are the two scores of pair i (one problem on one seed).
    The interval's ends are the (1-level)/2 and (1+level)/2 quantiles of the resampled means
    (numpy's default linear interpolation between order statistics).
    """
    m, b = np.asarray(method, dtype=float), np.asarray(baseline, dtype=float)
    if m.shape != b.shape:
        raise ValueError(f"paired scores must align: method {m.shape} vs baseline {b.shape}")
    diffs = m - b
    means = bootstrap_means(diffs, reps, seed)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return PairedDelta(float(diffs.mean()), float(low), float(high), int(diffs.size))
