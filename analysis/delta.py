"""Δ vs the baseline method (DAPO, the paper's main comparison), paired over (problem, seed).

For one benchmark and one statistic (Last or Best), a method's run with seed s is paired with
the baseline's run with the same seed; each run contributes its per-problem Mean@n at the
step that statistic picks (the final evaluated step for Last, the run's best step for Best),
read from the evaluation's per-sample records. Every problem both runs answered, on every
seed both methods ran, is one pair; `analysis.stats.paired_bootstrap` turns the pairs into
Δ = mean(method - baseline) and its 95% percentile interval. A seed only one side ran, or a
problem only one side evaluated, is left out (the pair count says how many remain).

Run: part of `python -m analysis report ... [--baseline DAPO] [--bootstrap-reps N]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis.collect import problem_scores
from analysis.stats import DEFAULT_REPS, DEFAULT_SEED, paired_bootstrap

DELTA_COLUMNS = ("delta", "delta_low", "delta_high", "delta_pairs")
BASELINE_METHOD = "DAPO"  # the paper's main comparison: the one owner of the default baseline
VERDICT_SCORER = "dapo"  # the scorer whose table the verdict reads by default (DAPO's grader)


@dataclass(frozen=True)
class DeltaOptions:
    """baseline: the label every other method is compared with; reps and seed: the
    bootstrap's resamples and Generator seed (the same seed gives the same intervals)."""

    baseline: str = BASELINE_METHOD
    reps: int = DEFAULT_REPS
    seed: int = DEFAULT_SEED

    def __post_init__(self) -> None:
        if self.reps < 1:
            raise ValueError(f"--bootstrap-reps must be >= 1, got {self.reps}")


class ScoreCache:
    """problem_scores with a cache for one table: Last and Best often pick the same step,
    and every method reads the baseline's records again."""

    def __init__(self, run_dirs: dict[str, Path]) -> None:
        self.run_dirs = run_dirs
        self.cache: dict[tuple[str, int, str], dict[str, dict[str, float]]] = {}

    def __call__(self, run_id: str, step: int, benchmark: str) -> dict[str, dict[str, float]]:
        key = (run_id, step, benchmark)
        if key not in self.cache:
            self.cache[key] = problem_scores(self.run_dirs[run_id], step, benchmark)
        return self.cache[key]


def paired_scores(method_runs: pd.DataFrame, base_runs: pd.DataFrame, stat: str, scorer: str,
                  scores: ScoreCache) -> tuple[list[float], list[float]]:
    """Aligned per-problem scores (method, baseline) over the seeds both sides ran."""
    base_by_seed = {int(r.seed): r for r in base_runs.itertuples()}
    ours, theirs = [], []
    for r in method_runs.sort_values("seed").itertuples():
        b = base_by_seed.get(int(r.seed))
        if b is None:
            continue
        step = f"{stat}_step"
        mine = scores(r.run_id, int(getattr(r, step)), r.benchmark)
        base = scores(b.run_id, int(getattr(b, step)), b.benchmark)
        mine, base = mine.get(scorer, {}), base.get(scorer, {})
        for pid in sorted(set(mine) & set(base)):
            ours.append(mine[pid])
            theirs.append(base[pid])
    return ours, theirs


def delta_fields(method_runs: pd.DataFrame, base_runs: pd.DataFrame, stat: str, scorer: str,
                 scores: ScoreCache, opts: DeltaOptions) -> dict:
    """DELTA_COLUMNS of one (method, baseline, stat): the paired bootstrap over their pairs,
    fractions; NaN and 0 pairs when they share no (problem, seed)."""
    ours, theirs = paired_scores(method_runs, base_runs, stat, scorer, scores)
    if not ours:
        return {"delta": math.nan, "delta_low": math.nan, "delta_high": math.nan,
                "delta_pairs": 0}
    d = paired_bootstrap(ours, theirs, opts.reps, opts.seed)
    return {"delta": d.delta, "delta_low": d.low, "delta_high": d.high, "delta_pairs": d.pairs}


def deltas_vs_baseline(per_run: pd.DataFrame, run_dirs: dict[str, Path], scorer: str,
                       opts: DeltaOptions, stats=("last", "best")) -> pd.DataFrame:
    """One row per (label, benchmark, stat) of every non-baseline label: delta, delta_low,
    delta_high (fractions), delta_pairs. `per_run` is `tables.per_run_last_best` output
    (run_id, label, seed, benchmark, last_step, best_step). No pairs -> NaN and 0 pairs;
    an absent baseline -> an empty frame."""
    rows, scores = [], ScoreCache(run_dirs)
    for bench, runs in per_run.groupby("benchmark", sort=False):
        base = runs[runs["label"] == opts.baseline]
        if base.empty:
            continue
        for label, method_runs in runs[runs["label"] != opts.baseline].groupby("label"):
            for stat in stats:
                rows.append({"label": label, "benchmark": bench, "stat": stat,
                             **delta_fields(method_runs, base, stat, scorer, scores, opts)})
    return pd.DataFrame(rows, columns=["label", "benchmark", "stat", *DELTA_COLUMNS])
