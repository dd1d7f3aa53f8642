"""Δ within an axis: every cell of an overlay against the same method at the axis's reference.

An overlay's axis (staleness 0/1/2, correction none/token_tis/...) asks how a setting moves
each method, not how a method compares with DAPO. `python -m analysis within --sweep-dir
results/ablation-staleness --reference stale0` pairs each run labelled "M [stale1]" with the
run labelled "M [stale0]" of the same seed and prints Δ Last, with its 95% paired t interval
over seeds and its Holm-adjusted p value over the table's Last comparisons, and Δ Best, a
point estimate (analysis.delta's pairing and interval, so the numbers read like the
report's Δ columns), as one Markdown table.

A label's bracketed tokens ("M [t1 t2]") come in the sweep's axis order, so the reference
replaces the token at its own position: a two-axis overlay pairs along one axis.
"""

from __future__ import annotations

import argparse
import math
import sys

import pandas as pd

from analysis.collect import collect
from analysis.delta import (
    DELTA_COLUMNS,
    TESTED_STAT,
    VERDICT_SCORER,
    Scores,
    delta_fields,
    family_size,
    holm_column,
)
from analysis.stats import delta_state
from analysis.tables import format_p, per_run_last_best
from common.layout import SweepDir


def split_label(label: str) -> tuple[str, list[str]]:
    """"M [t1 t2]" -> ("M", ["t1", "t2"]); a label without brackets has no tokens."""
    if label.endswith("]") and " [" in label:
        method, tokens = label[:-1].split(" [", 1)
        return method, tokens.split()
    return label, []


def reference_label(label: str, reference: str, position: int) -> str:
    """`label` with its token at `position` replaced by `reference`."""
    method, tokens = split_label(label)
    tokens = [*tokens[:position], reference, *tokens[position + 1:]]
    return f"{method} [{' '.join(tokens)}]"


def reference_position(labels, reference: str) -> int:
    """Where `reference` sits among the labels' tokens; a one-line ValueError if nowhere."""
    for label in labels:
        tokens = split_label(label)[1]
        if reference in tokens:
            return tokens.index(reference)
    seen = sorted({t for label in labels for t in split_label(label)[1]})
    raise ValueError(f"--reference {reference!r} is no label's axis token; tokens in this "
                     f"sweep: {', '.join(seen) or 'none (no axis overlay)'}")


def within_deltas(per_run: pd.DataFrame, scores: Scores, scorer: str,
                  reference: str) -> pd.DataFrame:
    """One row per (label, benchmark, stat) of every label not at the reference: its
    reference label and DELTA_COLUMNS (fractions; Holm over the Last rows). `per_run` is
    `tables.per_run_last_best` output. A missing reference run gives NaN and 0 seeds."""
    position = reference_position(per_run["label"].unique(), reference)
    rows = []
    for (bench, label), runs in per_run.groupby(["benchmark", "label"], sort=True):
        ref = reference_label(label, reference, position)
        if ref == label:
            continue
        base = per_run[(per_run["benchmark"] == bench) & (per_run["label"] == ref)]
        for stat in ("last", "best"):
            rows.append({"label": label, "reference": ref, "benchmark": bench, "stat": stat,
                         **delta_fields(runs, base, stat, scorer, scores)})
    out = pd.DataFrame(rows, columns=["label", "reference", "benchmark", "stat", *DELTA_COLUMNS])
    holm_column(out, out["stat"] == TESTED_STAT)
    return out


def _cell(row) -> str:
    if row.delta_seeds == 0:
        return "n/a"
    if math.isnan(row.delta_low):
        constant = delta_state(row.delta, row.delta_low, int(row.delta_seeds)) == "constant"
        return f"{100 * row.delta:+.2f}" + (f" (constant over {int(row.delta_seeds)} seeds)"
                                            if constant else "")
    text = f"{100 * row.delta:+.2f} [{100 * row.delta_low:+.2f}, {100 * row.delta_high:+.2f}]"
    if row.delta_low > 0 or row.delta_high < 0:
        text += f" * (Holm p {format_p(row.delta_p_holm)})"
    return text


def markdown(deltas: pd.DataFrame) -> str:
    """Rows: label; columns: Δ Last and Δ Best per benchmark, in percentage points. Last:
    the 95% paired t interval over seeds, `*` where it excludes 0 with the Holm-adjusted p
    over the table's K Last comparisons; Best: a point estimate (selected after the fact)."""
    benches = sorted(deltas["benchmark"].unique())
    header = ["Cell", "vs", *(f"Δ {b} {s.title()}" for b in benches for s in ("last", "best"))]
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 2)]
    for label, g in deltas.groupby("label", sort=True):
        by = {(r.benchmark, r.stat): _cell(r) for r in g.itertuples()}
        cells = [by.get((b, s), "n/a") for b in benches for s in ("last", "best")]
        lines.append(f"| {label} | {g['reference'].iloc[0]} | " + " | ".join(cells) + " |")
    k = family_size(deltas[deltas["stat"] == TESTED_STAT])
    note = (f"\nK = {k} comparisons at Last (Holm's adjustment over them); Best is a maximum "
            "over evaluated steps chosen after seeing them, biased upwards: a point estimate, "
            "not a test.\n")
    return "\n".join(lines) + "\n" + note


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis within", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep-dir", required=True, help="results/<sweep> (holds runs/)")
    p.add_argument("--reference", required=True,
                   help="the axis token every cell is compared with, e.g. stale0 or corr-none")
    p.add_argument("--scorer", default=VERDICT_SCORER)
    args = p.parse_args(argv)
    if not SweepDir(args.sweep_dir).runs.is_dir():
        print(f"error: --sweep-dir {args.sweep_dir}: no runs/ folder (run the sweep first)",
              file=sys.stderr)
        return 2
    col = collect(args.sweep_dir)
    try:
        per_run = per_run_last_best(col.eval, args.scorer)
        deltas = within_deltas(per_run, Scores.from_runs(col.runs), args.scorer, args.reference)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(markdown(deltas), end="")
    return 0
