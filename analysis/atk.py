"""pass@k and maj@k beside Mean@n at Last, for the warm start and every method: what a gain
is made of. A Mean@n that rises while pass@k stays means the model got surer of what it
could already solve (sharpening); pass@k rising means questions solved from zero.

    at_k_markdown(eval_df, initial, scorer)   # one table per benchmark, "" without data
"""

from __future__ import annotations

import re

import pandas as pd

from analysis.tables import benchmark_display, benchmark_order, label_order, per_run_last_best
from common.metrics import metric_meta

WARM_START = "warm start (step 0)"


def _largest_k(columns, family: str) -> str | None:
    ks = [int(m.group(1)) for c in columns if (m := re.fullmatch(rf"{family}_at_(\d+)", c))]
    return f"{family}_at_{max(ks)}" if ks else None


def _cell(metric: str, values: pd.Series | None) -> str:
    """The mean of `values` in the metric's format; "–" where there is none (a greedy
    column where this model was not evaluated greedily)."""
    if values is None or values.dropna().empty:
        return "–"
    return metric_meta(metric).format(float(values.dropna().mean()))


def at_k_markdown(eval_df: pd.DataFrame, initial: pd.DataFrame, scorer: str) -> str:
    """Per benchmark, the mean over seeds at Last of Mean@n, pass@k and maj@k (k the largest
    evaluated) and, where the sweep evaluated it (eval.greedy), the greedy answer's accuracy,
    for each method, and the warm start's own evaluation; "" without them."""
    pass_k, maj_k = _largest_k(eval_df.columns, "pass"), _largest_k(eval_df.columns, "maj")
    if eval_df.empty or pass_k is None or maj_k is None:
        return ""
    greedy = "greedy" in eval_df and eval_df.loc[eval_df["scorer"] == scorer, "greedy"].notna().any()
    metrics = ["mean", pass_k, maj_k] + (["greedy"] if greedy else [])
    runs = {m: per_run_last_best(eval_df, scorer, m) for m in metrics}
    heads = [metric_meta(m).display for m in metrics]
    out = []
    for bench in benchmark_order(runs["mean"]["benchmark"]):
        lines = [f"*{benchmark_display(bench)}, scorer {scorer}, at Last (mean over seeds; the "
                 f"warm start: its one evaluation):*", "",
                 "| Model | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(metrics)]
        warm = initial[(initial["benchmark"] == bench) & (initial["scorer"] == scorer)]
        if not warm.empty and all(m in warm for m in metrics[:3]):
            lines.append(f"| {WARM_START} | " + " | ".join(
                _cell(m, warm[m] if m in warm else None) for m in metrics) + " |")
        for label in label_order(runs["mean"]["label"]):
            cells = []
            for m in metrics:
                r = runs[m]
                cells.append(_cell(m, r[(r["label"] == label) & (r["benchmark"] == bench)]["last"]))
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        out.append("\n".join(lines) + "\n")
    return "\n".join(out)
