"""Accuracy by category on a generated benchmark whose questions come in kinds (arithmetic:
addition, subtraction, multiplication), beside the total: where a run learned, and where
the room to learn is.

A generated task that defines `category(question)` (common.arithmetic) gets, per scorer, one
row per method: the mean ± standard error over seeds of each run's Mean@n over that
category's problems at its Last step, and the initial model's row from its own per-problem
scores (run_id `initial`, step 0). Read from the per-problem scores alone, so a snapshot
ships it and `python -m analysis recompute` checks it.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.delta import Scores
from analysis.stats import seed_interval
from analysis.tables import benchmark_display, label_order, md_escape
from common.generated import GENERATED
from common.layout import INITIAL_DIR
from common.metrics import metric_meta
from eval.benchmarks import generated_split, load_benchmark

INITIAL_LABEL = "Initial model (step 0)"


def problem_categories(benchmark: str) -> dict[str, str] | None:
    """problem id -> category of a generated benchmark whose task defines `category`; None
    for any other benchmark (a hub benchmark is never read here)."""
    task = GENERATED.get(generated_split(benchmark)[0], None)
    if task is None or not hasattr(task, "category"):
        return None
    return {p["id"]: task.category(p["problem"]) for p in load_benchmark(benchmark).problems}


def _mean(values: dict[str, float], pids: list[str]) -> float:
    hits = [values[p] for p in pids if p in values]
    return float(np.mean(hits)) if hits else math.nan


def category_table(per_run: pd.DataFrame, scores: Scores, scorer: str,
                   benchmark: str) -> pd.DataFrame:
    """Rows (label, category, problems, mean, se, n_seeds), fractions, the initial model's
    first; empty when `benchmark` has no categories. `per_run`: tables.per_run_last_best."""
    cats = problem_categories(benchmark)
    runs = per_run[per_run["benchmark"] == benchmark]
    if cats is None or runs.empty:
        return pd.DataFrame(columns=["label", "category", "problems", "mean", "se", "n_seeds"])
    by_cat: dict[str, list[str]] = {}
    for pid, cat in cats.items():
        by_cat.setdefault(cat, []).append(pid)
    rows = []
    initial = scores(INITIAL_DIR, 0, benchmark).get(scorer, {})
    for cat, pids in by_cat.items():
        asked = [p for p in pids if p in initial]
        if asked:
            rows.append({"label": INITIAL_LABEL, "category": cat, "problems": len(asked),
                         "mean": _mean(initial, asked), "se": math.nan, "n_seeds": 1})
    for label in label_order(runs["label"]):
        group = runs[runs["label"] == label]
        per_seed = [scores(r.run_id, int(r.last_step), benchmark).get(scorer, {})
                    for r in group.itertuples()]
        for cat, pids in by_cat.items():
            means = [m for m in (_mean(s, pids) for s in per_seed) if not math.isnan(m)]
            if means:
                s = seed_interval(means)
                asked = sum(p in per_seed[0] for p in pids)
                rows.append({"label": label, "category": cat, "problems": asked,
                             "mean": s.mean, "se": s.se, "n_seeds": s.k})
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame, scorer: str, benchmark: str) -> str:
    """The table as Markdown: a row per method, a column per category (mean ± se, percent)."""
    meta = metric_meta("mean")
    cats = list(dict.fromkeys(table["category"]))
    sizes = table.groupby("category", sort=False)["problems"].max()
    header = ["Method", *(f"{c} ({int(sizes[c])})" for c in cats)]
    lines = [f"*{benchmark_display(benchmark)} by category, scorer {scorer}: Mean@n in percent at "
             "Last, mean ± standard error over seeds (the initial model: one evaluation); in "
             "brackets, the problems of each category.*", "",
             "| " + " | ".join(header) + " |", "|---|" + "---:|" * len(cats)]
    for label in dict.fromkeys(table["label"]):
        cells = []
        for cat in cats:
            row = table[(table["label"] == label) & (table["category"] == cat)]
            if row.empty:
                cells.append("–")
                continue
            r = row.iloc[0]
            se = "" if math.isnan(r.se) else f" ± {meta.format(r.se)}"
            cells.append(f"{meta.format(r['mean'])}{se}")
        lines.append(f"| {md_escape(label)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
