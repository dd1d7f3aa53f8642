"""Δ vs the baseline method (DAPO, the paper's main comparison), with the training run as the unit.

For one benchmark and one statistic (Last or Best), a method's run with seed s is paired with
the baseline's run with the same seed; each run contributes its per-problem Mean@n at the
step that statistic picks (the final evaluated step for Last, the run's best step for Best),
read from the per-problem score table (`analysis.collect.problem_score_table`, or the
snapshot's `tables/problem_scores.csv.gz`). Inside a seed the problems both runs answered
are averaged into Δ_s; over the seeds both methods ran, `analysis.stats.seed_delta` gives
Δ = mean Δ_s, its 95% paired t interval and p value. A seed only one side ran, or a problem
only one side evaluated, is left out (the seed and problem counts say how many remain).

Best is a maximum over steps chosen after seeing them, so it is biased upwards: its Δ is a
point estimate only, never an interval or a separation (docs/statistics.md). A report that
makes K Last comparisons states K, and `holm_column` gives each its Holm-adjusted p value.

Run: part of `python -m analysis report ... [--baseline DAPO]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.collect import SCORE_COLUMNS, problem_score_table
from analysis.stats import SeedDelta, delta_state, holm, seed_delta

DELTA_COLUMNS = ("delta", "delta_low", "delta_high", "delta_p", "delta_p_holm", "delta_seeds",
                 "delta_problems")
BASELINE_METHOD = "DAPO"  # the paper's main comparison: the one owner of the default baseline
VERDICT_SCORER = "dapo"  # the scorer whose table the verdict reads by default (DAPO's grader)
TESTED_STAT = "last"  # the statistic with intervals, separations and a multiplicity reading


@dataclass(frozen=True)
class DeltaOptions:
    """baseline: the label every other method is compared with."""

    baseline: str = BASELINE_METHOD


class Scores:
    """Per-problem Mean@n of every evaluated (run, step, benchmark):
    `scores(run_id, step, benchmark)` -> {scorer: {problem_id: fraction correct}}, {} when
    that evaluation has no records. Built from a problem-score table (SCORE_COLUMNS)."""

    def __init__(self, table: pd.DataFrame) -> None:
        missing = set(SCORE_COLUMNS) - set(table.columns)
        if missing:
            raise ValueError(f"a problem-score table needs columns {SCORE_COLUMNS}; "
                             f"missing {sorted(missing)}")
        self.table = table
        self._by: dict[tuple[str, int, str], dict[str, dict[str, float]]] = {}
        fraction = table["correct"].to_numpy(dtype=float) / table["samples"].to_numpy(dtype=float)
        keys = zip(table["run_id"], table["step"], table["benchmark"], table["scorer"],
                   table["problem_id"].astype(str), fraction)
        for run, step, bench, scorer, pid, value in keys:
            self._by.setdefault((str(run), int(step), str(bench)), {}).setdefault(
                str(scorer), {})[pid] = float(value)

    @classmethod
    def from_runs(cls, runs: pd.DataFrame) -> Scores:
        """From the runs' per-sample records (`runs`: collect()'s runs frame)."""
        return cls(problem_score_table(runs))

    def __call__(self, run_id: str, step: int, benchmark: str) -> dict[str, dict[str, float]]:
        return self._by.get((str(run_id), int(step), str(benchmark)), {})


def paired_scores(method_runs: pd.DataFrame, base_runs: pd.DataFrame, stat: str, scorer: str,
                  scores: Scores) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per seed both sides ran (in seed order), the two runs' per-problem scores aligned on
    the problems both evaluated: (method arrays, baseline arrays), one array per seed."""
    base_by_seed = {int(r.seed): r for r in base_runs.itertuples()}
    ours, theirs = [], []
    for r in method_runs.sort_values("seed").itertuples():
        b = base_by_seed.get(int(r.seed))
        if b is None:
            continue
        step = f"{stat}_step"
        mine = scores(r.run_id, int(getattr(r, step)), r.benchmark).get(scorer, {})
        base = scores(b.run_id, int(getattr(b, step)), b.benchmark).get(scorer, {})
        pids = sorted(set(mine) & set(base))
        if pids:
            ours.append(np.array([mine[p] for p in pids]))
            theirs.append(np.array([base[p] for p in pids]))
    return ours, theirs


def delta_fields(method_runs: pd.DataFrame, base_runs: pd.DataFrame, stat: str, scorer: str,
                 scores: Scores) -> dict:
    """DELTA_COLUMNS of one (method, baseline, stat), fractions: the paired t over seeds for
    Last; Δ alone for Best; NaN and 0 seeds when they share no (problem, seed). The Holm
    column is NaN here (`holm_column` fills it over a family). A Δ_s that is the same in
    every seed (every score equal on both sides, say) gets no interval and no p value, so
    it is neither tested nor counted in K: `row_state` says which it is."""
    ours, theirs = paired_scores(method_runs, base_runs, stat, scorer, scores)
    if not ours:
        return {**dict.fromkeys(DELTA_COLUMNS, math.nan), "delta_seeds": 0, "delta_problems": 0}
    d = seed_delta(ours, theirs)
    if stat != TESTED_STAT:  # Best: selected after the fact, a point estimate only
        d = SeedDelta(d.delta, math.nan, math.nan, math.nan, d.sd, d.seeds, d.problems)
    return delta_row(d)


def row_state(row) -> str:
    """`analysis.stats.delta_state` of one row holding DELTA_COLUMNS and `stat`."""
    return delta_state(row.delta, row.delta_low, int(row.delta_seeds),
                       point=row.stat != TESTED_STAT)


def delta_row(d: SeedDelta) -> dict:
    """DELTA_COLUMNS of a SeedDelta (Holm left NaN)."""
    return {"delta": d.delta, "delta_low": d.low, "delta_high": d.high, "delta_p": d.p,
            "delta_p_holm": math.nan, "delta_seeds": d.seeds, "delta_problems": d.problems}


def holm_column(frame: pd.DataFrame, rows=None, p: str = "delta_p",
                out: str = "delta_p_holm") -> None:
    """Fill `out` with the Holm-adjusted `p` over `rows` of `frame` (a boolean mask; all rows
    by default), in place: one family, the comparisons a report states together. Rows
    without a p value (one seed, a constant Δ_s) are not counted."""
    rows = pd.Series(True, index=frame.index) if rows is None else rows
    frame[out] = frame[out] if out in frame else math.nan
    if rows.any():
        frame.loc[rows, out] = holm(frame.loc[rows, p].to_numpy(dtype=float))


def family_size(frame: pd.DataFrame, p: str = "delta_p") -> int:
    """K: how many comparisons of `frame` were tested (have a p value)."""
    return int(frame[p].notna().sum()) if p in frame else 0


def deltas_vs_baseline(per_run: pd.DataFrame, scores: Scores, scorer: str,
                       opts: DeltaOptions, stats=("last", "best")) -> pd.DataFrame:
    """One row per (label, benchmark, stat) of every non-baseline label: DELTA_COLUMNS
    (fractions), Holm over all Last rows. `per_run` is `tables.per_run_last_best` output
    (run_id, label, seed, benchmark, last_step, best_step). No pairs -> NaN and 0 seeds;
    an absent baseline -> an empty frame."""
    rows = []
    for bench, runs in per_run.groupby("benchmark", sort=False):
        base = runs[runs["label"] == opts.baseline]
        if base.empty:
            continue
        for label, method_runs in runs[runs["label"] != opts.baseline].groupby("label"):
            for stat in stats:
                rows.append({"label": label, "benchmark": bench, "stat": stat,
                             **delta_fields(method_runs, base, stat, scorer, scores)})
    out = pd.DataFrame(rows, columns=["label", "benchmark", "stat", *DELTA_COLUMNS])
    holm_column(out, out["stat"] == TESTED_STAT)
    return out
