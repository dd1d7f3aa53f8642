"""Read what a report ships, without its run folders: a snapshot under docs/runs/, or any
report's `--out` folder.

    eval_df, scores, initial = read_published("docs/runs/frontier")

A report writes `tables/eval_metrics.csv` (every evaluation summary),
`tables/problem_scores.csv.gz` (every per-problem score the intervals read) and
`tables/initial_metrics.csv` (the initial model's summaries, the verdict's warm start). From
those three, `python -m analysis recompute` rebuilds every published number and sentence, and
`analysis power` and `analysis calibrate --sweep-dir` plan from a snapshot as from a sweep.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.collect import SCORE_COLUMNS, collect, collect_initial
from analysis.delta import Scores
from common.layout import SweepDir


def is_published(folder: str | Path) -> bool:
    """A report's output without runs/ (a snapshot): read with `read_published`."""
    snap = SweepDir(folder)
    return not snap.runs.is_dir() and snap.problem_scores.is_file()


def read_published(folder: str | Path) -> tuple[pd.DataFrame, Scores, pd.DataFrame]:
    """(evaluation rows, per-problem scores, initial model rows) of a report's folder; a
    one-line FileNotFoundError names what is missing. A folder without initial_metrics.csv
    (the initial model was not evaluated) gives an empty initial frame."""
    snap = SweepDir(folder)
    evals = snap.tables / "eval_metrics.csv"
    for path in (evals, snap.problem_scores):
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: a snapshot ships the report's "
                                    "tables/eval_metrics.csv and tables/problem_scores.csv.gz")
    eval_df = _strings(pd.read_csv(evals))
    table = pd.read_csv(snap.problem_scores, dtype={"problem_id": str, "run_id": str})
    initial = (pd.read_csv(snap.initial_metrics) if snap.initial_metrics.is_file()
               else pd.DataFrame(columns=["step", "benchmark", "scorer"]))
    return eval_df, Scores(table[SCORE_COLUMNS]), initial


def read_sweep_or_published(folder: str | Path) -> tuple[pd.DataFrame, Scores, pd.DataFrame]:
    """`read_published` of a snapshot, else the same three read from a sweep's runs."""
    if is_published(folder):
        return read_published(folder)
    if not SweepDir(folder).runs.is_dir():
        raise FileNotFoundError(f"{folder}: neither a sweep (no runs/ folder inside) nor a "
                                "snapshot (no tables/problem_scores.csv.gz)")
    col = collect(folder)
    return col.eval, Scores.from_runs(col.runs), collect_initial(folder)


def _strings(eval_df: pd.DataFrame) -> pd.DataFrame:
    """Text columns as the collector holds them ("" for a missing tag, never NaN)."""
    for col in [c for c in eval_df.columns if c.startswith("tag_")] + ["label", "run_id"]:
        eval_df[col] = eval_df[col].fillna("").astype(str)
    return eval_df
