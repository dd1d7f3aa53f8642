"""Benchmark metrics from per-sample grades: Mean@n, pass@k, maj@k and their uncertainty.

All metrics are accuracies in [0, 1], higher is better, computed per problem and then
averaged over problems (every problem has the same number of samples n):

* ``mean``        Mean@n: average accuracy over all n samples of all problems (the paper's
                  "Mean@32"). ``mean_stderr`` is the standard error of the per-problem
                  accuracies (sample std / sqrt(#problems)); ``mean_ci95_low/high`` is a
                  seeded percentile bootstrap over problems.
* ``pass_at_k``   unbiased pass@k (Chen et al. 2021, eq. 1) for k in 1, 2, 4, ..., n.
* ``maj_at_k``    majority vote over the first k samples' extracted answers (ties go to
                  the answer seen first; samples with no answer do not vote).
* ``extract_fail_rate`` / ``timeout_rate`` / ``error_rate``: fraction of samples whose
  grade status was "no_answer" / "timeout" / "error".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from common.grading import GradeResult

BOOTSTRAP_RESAMPLES = 2000


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k = 1 - C(n-c, k) / C(n, k) for c correct out of n samples."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n; got k={k} with only n={n} samples")
    if n - c < k:
        return 1.0
    # Product form of the binomial ratio: no huge integers, stable for n in the thousands.
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def ks_for(n: int) -> list[int]:
    """The k values reported for n samples: powers of two up to n, plus n itself."""
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    ks = [2**i for i in range(int(math.log2(n)) + 1)]
    return ks if ks[-1] == n else [*ks, n]


def majority_correct(grades: Sequence[GradeResult], k: int) -> bool:
    """Whether the majority answer among the first `k` grades is correct."""
    if not 1 <= k <= len(grades):
        raise ValueError(f"maj@k needs 1 <= k <= n; got k={k} with n={len(grades)}")
    votes: dict[str, int] = {}
    verdict: dict[str, bool] = {}
    for g in grades[:k]:
        if g.extracted is None or g.status != "ok":
            continue
        votes[g.extracted] = votes.get(g.extracted, 0) + 1
        verdict.setdefault(g.extracted, g.correct)
    if not votes:
        return False
    winner = max(votes, key=votes.__getitem__)  # dicts keep insertion order: first seen wins
    return verdict[winner]


def bootstrap_ci(
    values: Sequence[float], seed: int, resamples: int = BOOTSTRAP_RESAMPLES
) -> tuple[float, float]:
    """Percentile 95% interval of the mean of `values`, resampling items with replacement."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(resamples, x.size))  # (R, P)
    means = x[idx].mean(axis=1)  # (R,)
    low, high = np.quantile(means, [0.025, 0.975])
    return float(low), float(high)


def summarize_scorer(
    per_problem: Sequence[Sequence[GradeResult]], seed: int = 0, ks: Sequence[int] | None = None
) -> dict:
    """Summary metrics of one scorer; `per_problem[i][j]` grades sample j of problem i.

    `ks` are the k of pass@k and maj@k (default `ks_for(n)`); each must be <= n.
    """
    if not per_problem:
        raise ValueError("no problems to summarize")
    n = len(per_problem[0])
    if n == 0 or any(len(p) != n for p in per_problem):
        sizes = sorted({len(p) for p in per_problem})
        raise ValueError(f"every problem needs the same number (>0) of samples; got {sizes}")
    ks = sorted(set(ks)) if ks else ks_for(n)
    if ks[0] < 1 or ks[-1] > n:
        raise ValueError(f"ks={ks}: pass@k and maj@k need 1 <= k <= n (n={n})")
    correct = np.array([[g.correct for g in p] for p in per_problem], dtype=np.float64)  # (P, n)
    statuses = [g.status for p in per_problem for g in p]
    acc = correct.mean(axis=1)  # (P,) per-problem accuracy
    stderr = float(acc.std(ddof=1) / math.sqrt(acc.size)) if acc.size > 1 else 0.0
    low, high = bootstrap_ci(acc, seed)
    out: dict[str, float] = {
        "mean": float(acc.mean()),
        "mean_stderr": stderr,
        "mean_ci95_low": low,
        "mean_ci95_high": high,
    }
    num_correct = correct.sum(axis=1).astype(int)
    for k in ks:
        out[f"pass_at_{k}"] = float(np.mean([pass_at_k(n, int(c), k) for c in num_correct]))
    for k in ks:
        out[f"maj_at_{k}"] = float(np.mean([majority_correct(p, k) for p in per_problem]))
    total = len(statuses)
    out["extract_fail_rate"] = statuses.count("no_answer") / total
    out["timeout_rate"] = statuses.count("timeout") / total
    out["error_rate"] = statuses.count("error") / total
    return out


def truncation_rate(finish_reasons: Sequence[str]) -> float:
    """Fraction of samples that hit max_new_tokens (finish_reason "length")."""
    if not finish_reasons:
        raise ValueError("no samples")
    return sum(r == "length" for r in finish_reasons) / len(finish_reasons)
