"""Uncertainty of a sweep's numbers, with the training run (a seed) as the unit.

A sweep's problems and samples are nested inside training runs: the 121 problems of one seed
share one run, and that run's luck moves all of them together. So every interval here treats
the seed as the unit of replication (docs/statistics.md says why and what it costs):

- *How much does a method's score move from seed to seed?* `seed_interval` gives the mean
  over k seeds, its standard error (sample sd, ddof = 1, over sqrt(k)) and the 95% Student-t
  interval `mean ± t(0.975, k - 1) · se`, clipped to the range the quantity can take (a
  fraction lies in [0, 1], a KL is >= 0: clipping keeps the coverage, as the true mean lies
  inside). With one seed there is no spread: every uncertainty field is NaN.

- *Is a method better than the baseline?* `seed_delta` pairs the method's run of seed s with
  the baseline's run of the same seed, averages the per-problem differences inside each seed
  (Δ_s: problems nested within seed), and gives the paired t interval over the Δ_s with
  k - 1 degrees of freedom and its two-sided p value. It is exact when the Δ_s are normal and
  stays calibrated with 3 seeds (`python -m analysis calibrate` checks it by simulation); a
  bootstrap over 3-5 seeds undercovers. The inference is about this benchmark's problems:
  they are the same in every seed, so a problem that favours one method is part of Δ.

- *K contrasts at once:* `holm` adjusts their p values (Holm's step-down, family-wise).

`problem_bootstrap` is the interval the harness used before: it resamples (problem, seed)
pairs as if independent, which ignores run-to-run variance and separates 37-46% of null
comparisons once runs differ by 4 points (`python -m analysis calibrate` with it put back).
It is kept only so tests/analysis/test_calibrate.py can put it back into `analysis.delta` and
see calibrate fail; no table or verdict uses it.

Values are fractions (0.25, not 25); rendering to percent is the tables' job.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _scipy_stats

LEVEL = 0.95
UNBOUNDED = (-math.inf, math.inf)


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


def _values(values, what: str) -> np.ndarray:
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or x.size == 0 or not np.isfinite(x).all():
        raise ValueError(f"{what} needs a non-empty 1-d array of finite numbers, got {x}")
    return x


def seed_interval(values, level: float = LEVEL,
                  bounds: tuple[float, float] = UNBOUNDED) -> SeedInterval:
    """Mean, standard error and `level` t interval of per-seed values, the interval clipped
    to `bounds` (see module doc)."""
    x = _values(values, "seed_interval")
    mean = float(x.mean())
    if x.size < 2:
        return SeedInterval(mean, math.nan, math.nan, math.nan, 1)
    se = float(x.std(ddof=1) / math.sqrt(x.size))
    half = t_quantile(x.size, level) * se
    return SeedInterval(mean, se, *clip_interval(mean - half, mean + half, bounds), int(x.size))


def clip_interval(low: float, high: float,
                  bounds: tuple[float, float] = UNBOUNDED) -> tuple[float, float]:
    """(low, high) moved into `bounds`, each end on its own, so the result stays ordered:
    a mean estimate outside the range (a k1 KL estimate below 0) gives [0, 0] or a
    one-sided interval, never high < low. Where the mean itself lies outside, the tables
    say so (`outside`)."""
    lo_b, hi_b = bounds
    return min(max(low, lo_b), hi_b), max(min(high, hi_b), lo_b)


def outside(mean: float, low: float, high: float) -> bool:
    """The mean lies outside its (clipped) interval: only possible after `clip_interval`."""
    return not (math.isnan(low) or low <= mean <= high)


@dataclass(frozen=True)
class SeedDelta:
    """Δ = mean over seeds of the per-seed differences Δ_s, its paired t interval and p
    value (NaN with one seed), the sd of the Δ_s, and how many seeds and problems (per
    seed, the fewest) it rests on."""

    delta: float
    low: float
    high: float
    p: float
    sd: float
    seeds: int
    problems: int

    @property
    def state(self) -> str:
        """What the comparison can say (`delta_state`)."""
        return delta_state(self.delta, self.low, self.seeds)

    @property
    def verdict(self) -> str:
        """'better' / 'worse' when the interval excludes 0, else 'tie' (not distinguishable;
        also with one seed or a constant Δ_s, where there is no interval)."""
        if self.low > 0:
            return "better"
        if self.high < 0:
            return "worse"
        return "tie"


# sd of the per-seed Δ_s below which they count as equal: Δ_s are means of k/n-valued
# scores over P problems, so two that differ do so by 1/(n P) >= 1e-6 for any real design;
# what is below is the last bits of a sum taken in another order
CONSTANT_SD = 1e-12


def paired_t(differences, level: float = LEVEL, problems: int = 1) -> SeedDelta:
    """The paired t interval and two-sided p value of per-seed differences (one per seed).

    All differences equal (sd <= CONSTANT_SD): no interval and no p value. The t statistic
    is 0/0 or infinite there, and neither is evidence: a 2-problem benchmark gives the same
    non-zero Δ_s on 3 seeds by chance in about 2% of null studies. `delta_state` names it."""
    d = _values(differences, "paired_t")
    mean = float(d.mean())
    if d.size < 2:
        return SeedDelta(mean, math.nan, math.nan, math.nan, math.nan, 1, problems)
    sd = float(d.std(ddof=1))
    if sd <= CONSTANT_SD:
        return SeedDelta(mean, math.nan, math.nan, math.nan, 0.0, int(d.size), problems)
    se = sd / math.sqrt(d.size)
    half = t_quantile(d.size, level) * se
    p = float(2 * _scipy_stats.t.sf(abs(mean) / se, d.size - 1))
    return SeedDelta(mean, mean - half, mean + half, p, sd, int(d.size), problems)


DELTA_STATES = {
    "tested": "a paired t interval and p value over the seeds",
    "one seed": "one seed paired with the baseline: no spread, no interval",
    "nothing to test": "Δ_s = 0 in every seed (e.g. every sample scored the same on both "
                       "sides): no spread and no difference",
    "constant": "the same non-zero Δ_s in every seed: no spread, so no p value and no finding",
    "point": "a point estimate only (Best: chosen after seeing the steps)",
    "no pairs": "no seed and problem both runs evaluated",
}


def delta_state(delta: float, low: float, seeds: int, point: bool = False) -> str:
    """Which of DELTA_STATES a Δ is in, from the columns every Δ table keeps (Δ, its low
    end, its seed count); `point` marks a Best Δ."""
    if delta is None or math.isnan(delta):
        return "no pairs"
    if point:
        return "point"
    if seeds < 2:
        return "one seed"
    if math.isnan(low):
        return "nothing to test" if delta == 0 else "constant"
    return "tested"


def seed_delta(method: Sequence, baseline: Sequence, level: float = LEVEL) -> SeedDelta:
    """Δ of a method against the baseline with the run as the unit: `method[s]` and
    `baseline[s]` are the per-problem scores of seed s's two runs, aligned problem by
    problem; Δ_s = their mean difference, then `paired_t` over the seeds."""
    if len(method) != len(baseline) or not len(method):
        raise ValueError(f"seed_delta needs the same non-zero number of seeds on both sides, "
                         f"got {len(method)} and {len(baseline)}")
    per_seed, problems = [], []
    for s, (m, b) in enumerate(zip(method, baseline)):
        m, b = np.asarray(m, dtype=float), np.asarray(b, dtype=float)
        if m.shape != b.shape or m.ndim != 1 or m.size == 0:
            raise ValueError(f"seed {s}: per-problem scores must align, got {m.shape} and {b.shape}")
        per_seed.append(float((m - b).mean()))
        problems.append(m.size)
    return paired_t(per_seed, level, problems=min(problems))


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p values (family-wise error, any dependence): the i-th
    smallest p becomes max over j <= i of min(1, (K - j + 1) p_(j)). NaN stays NaN and is
    not counted in K."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, math.nan)
    idx = np.flatnonzero(~np.isnan(p))
    order = idx[np.argsort(p[idx], kind="stable")]
    k = len(order)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (k - rank) * p[i]))
        out[i] = running
    return out


# ---------------------------------------------------------------------------------------
# The old interval, for analysis.calibrate's comparison only
# ---------------------------------------------------------------------------------------

_CHUNK_DRAWS = 4_000_000  # indices drawn per Generator call: caps memory near 32 MB


def bootstrap_means(diffs, reps: int, seed: int = 0) -> np.ndarray:
    """`reps` means of `len(diffs)` values drawn with replacement, in chunks of rows by one
    seeded Generator, so the result depends on (diffs, reps, seed) only."""
    d = _values(diffs, "bootstrap")
    if reps < 1:
        raise ValueError(f"bootstrap reps must be >= 1, got {reps}")
    rng = np.random.default_rng(seed)
    rows = max(1, _CHUNK_DRAWS // d.size)
    means = [
        d[rng.integers(0, d.size, size=(min(rows, reps - start), d.size))].mean(axis=1)
        for start in range(0, reps, rows)
    ]
    return np.concatenate(means)


def problem_bootstrap(method, baseline, reps: int = 10_000, seed: int = 0,
                      level: float = LEVEL) -> tuple[float, float, float]:
    """(Δ, low, high): the percentile bootstrap over (problem, seed) pairs as if
    exchangeable, the harness's interval before the run became the unit (see module doc)."""
    m, b = np.asarray(method, dtype=float).ravel(), np.asarray(baseline, dtype=float).ravel()
    if m.shape != b.shape:
        raise ValueError(f"paired scores must align: method {m.shape} vs baseline {b.shape}")
    means = bootstrap_means(m - b, reps, seed)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float((m - b).mean()), float(low), float(high)


@dataclass(frozen=True)
class Gain:
    """A method's gain over the warm start on one benchmark: `gain` = its mean over seeds and
    problems less the warm start's on the same problems, with a 95% interval that carries
    both uncertainties (`gain_interval`); `problems`, `seeds`: what it rests on."""

    gain: float
    low: float
    high: float
    df: float
    problems: int
    seeds: int


def gain_interval(method: Sequence, warm: Sequence, level: float = LEVEL) -> Gain:
    """The gain of a method over the warm start, paired over problems.

    method: [S seeds x P problems] per-problem Mean@n at Last; warm: [P] the warm start's, on
    the same problems in the same order. The warm start is one evaluation of P questions, so
    its score is as uncertain as a seed's: the gain's variance is the problems' term, the
    variance over problems of d_i = (method's seed mean on i) - (warm start on i), over P
    (the questions drawn, and the warm start's and the method's sampling noise on them),
    plus the seeds' term, the variance of the method's per-seed means over S (training
    randomness). The interval is Student's t on their Welch-Satterthwaite degrees of
    freedom, clipped to [-1, 1]. The method's sampling noise is in both terms: conservative.
    tests/analysis/test_gain.py checks its coverage by simulation."""
    m = np.asarray(method, dtype=float)
    w = np.asarray(warm, dtype=float)
    if m.ndim != 2 or w.ndim != 1 or m.shape[1] != w.size or w.size < 2:
        raise ValueError(f"gain_interval needs [seeds x problems] and [problems] scores with "
                         f"at least 2 problems, got {m.shape} and {w.shape}")
    seeds, problems = m.shape
    d = m.mean(axis=0) - w
    var_p = d.var(ddof=1) / problems
    var_s = m.mean(axis=1).var(ddof=1) / seeds if seeds > 1 else 0.0
    gain = float(d.mean())
    se = math.sqrt(var_p + var_s)
    if se == 0:
        return Gain(gain, gain, gain, math.inf, problems, seeds)
    df = se**4 / (var_p**2 / (problems - 1) + (var_s**2 / (seeds - 1) if seeds > 1 else 0.0))
    half = float(_scipy_stats.t.ppf(0.5 + level / 2, df)) * se
    return Gain(gain, max(-1.0, gain - half), min(1.0, gain + half), df, problems, seeds)
