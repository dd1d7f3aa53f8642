"""Recompute a snapshot's published numbers from what it ships, and compare.

    python -m analysis recompute docs/runs/<name> [docs/runs/<other> ...]

A snapshot (docs/runs/<name>/, or any report's output folder) ships `tables/eval_metrics.csv`
(every evaluation summary) and `tables/problem_scores.csv.gz` (every per-problem score).
From those two alone this rebuilds each `tables/last_best_<scorer>.csv` (seed intervals, Δ
vs the baseline with its paired t interval, p and Holm p) and `tables/contrasts.csv` (an
overlay's contrasts) with the report's own code, and compares every number with the
published file. It prints one line per table and exits 1 on any difference (0 otherwise),
so a reader can check a published interval without the run folders, which no snapshot
keeps.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import contrasts
from analysis.collect import SCORE_COLUMNS
from analysis.delta import VERDICT_SCORER, DeltaOptions, Scores
from analysis.tables import last_best_table, per_run_last_best
from common.layout import SweepDir

TOLERANCE = 1e-9  # absolute: another CPU may sum in another order (last bits)


def read_snapshot(folder: str | Path) -> tuple[pd.DataFrame, Scores]:
    """(the evaluation rows, the per-problem scores) a snapshot ships; a one-line
    FileNotFoundError names what is missing."""
    snap = SweepDir(folder)
    evals = snap.tables / "eval_metrics.csv"
    for path in (evals, snap.problem_scores):
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: a snapshot ships the report's "
                                    "tables/eval_metrics.csv and tables/problem_scores.csv.gz")
    eval_df = pd.read_csv(evals)
    for col in [c for c in eval_df.columns if c.startswith("tag_")] + ["label", "run_id"]:
        eval_df[col] = eval_df[col].fillna("").astype(str)
    table = pd.read_csv(snap.problem_scores, dtype={"problem_id": str, "run_id": str})
    return eval_df, Scores(table[SCORE_COLUMNS])


def compare(published: pd.DataFrame, rebuilt: pd.DataFrame, keys: list[str]) -> list[str]:
    """The differences between two tables on their shared numeric columns, row by `keys`."""
    pub, new = published.set_index(keys).sort_index(), rebuilt.set_index(keys).sort_index()
    if list(pub.index) != list(new.index):
        return [f"rows differ: published {len(pub)}, recomputed {len(new)}"]
    diffs = []
    for col in pub.columns.intersection(new.columns):
        a = pd.to_numeric(pub[col], errors="coerce").to_numpy(dtype=float)
        b = pd.to_numeric(new[col], errors="coerce").to_numpy(dtype=float)
        if np.isnan(a).all() and pub[col].notna().any():
            continue  # a text column
        bad = ~((np.isnan(a) & np.isnan(b)) | (np.abs(a - b) <= TOLERANCE))
        diffs += [f"{col} at {idx}: published {x!r}, recomputed {y!r}"
                  for idx, x, y in zip(pub.index[bad], a[bad], b[bad])]
    return diffs


def recompute(folder: str | Path) -> list[tuple[str, int, list[str]]]:
    """(table file, numbers compared, differences) per published table of a snapshot."""
    snap = SweepDir(folder)
    eval_df, scores = read_snapshot(folder)
    out = []
    for path in sorted(snap.tables.glob("last_best_*.csv")):
        published = pd.read_csv(path)
        scorer, metric = str(published["scorer"].iloc[0]), str(published["metric"].iloc[0])
        baseline = str(published["baseline"].iloc[0])
        rebuilt = last_best_table(eval_df, scorer, metric, scores=scores,
                                  delta=DeltaOptions(baseline))
        keys = ["label", "benchmark", "stat"]
        out.append((path.name, _count(published), compare(published, rebuilt, keys)))
    path = snap.tables / contrasts.CSV_NAME
    if path.is_file():
        published = pd.read_csv(path)
        scorer = VERDICT_SCORER
        bench = str(published["benchmark"].iloc[0])
        rebuilt = contrasts.contrast_rows(per_run_last_best(eval_df, scorer), scores, scorer,
                                          bench)
        out.append((path.name, _count(published),
                    compare(published, rebuilt, ["contrast", "label", "partner"])))
    return out


def _count(df: pd.DataFrame) -> int:
    values = df.select_dtypes("number").to_numpy(dtype=float)
    return int(np.sum(~np.isnan(values)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis recompute", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("snapshots", nargs="+", help="docs/runs/<name> or a report's --out folder")
    args = p.parse_args(argv)
    failed = False
    for folder in args.snapshots:
        try:
            results = recompute(folder)
        except (FileNotFoundError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        for name, count, diffs in results:
            status = "all equal" if not diffs else f"{len(diffs)} differ"
            print(f"{folder}/tables/{name}: {count} numbers recomputed, {status}")
            for line in diffs[:20]:
                print(f"  {line}")
            failed |= bool(diffs)
        if not results:
            print(f"{folder}: no published table to recompute")
    return 1 if failed else 0
