"""Δ within an axis: every cell of an overlay against the same method at the axis's reference.

An overlay's axis (staleness 0/1/2, correction none/token_tis/...) asks how a setting moves
each method, not how a method compares with DAPO. `python -m analysis within --sweep-dir
results/ablation-staleness --reference stale0` pairs each run labelled "M [stale1]" with the
run labelled "M [stale0]" of the same seed, problem by problem, and prints Δ Last and Δ Best
per benchmark with the paired bootstrap's 95% interval (analysis.delta's pairing and
bootstrap, so the numbers read like the report's Δ columns), as one Markdown table.

A label's bracketed tokens ("M [t1 t2]") come in the sweep's axis order, so the reference
replaces the token at its own position: a two-axis overlay pairs along one axis.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from analysis.collect import collect
from analysis.delta import DELTA_COLUMNS, VERDICT_SCORER, DeltaOptions, ScoreCache, delta_fields
from analysis.tables import per_run_last_best
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


def within_deltas(per_run: pd.DataFrame, run_dirs: dict[str, Path], scorer: str,
                  reference: str, opts: DeltaOptions | None = None) -> pd.DataFrame:
    """One row per (label, benchmark, stat) of every label not at the reference: its
    reference label, delta, delta_low, delta_high (fractions), delta_pairs. `per_run` is
    `tables.per_run_last_best` output. A missing reference run gives NaN and 0 pairs."""
    opts = opts or DeltaOptions()
    position = reference_position(per_run["label"].unique(), reference)
    rows, scores = [], ScoreCache(run_dirs)
    for (bench, label), runs in per_run.groupby(["benchmark", "label"], sort=True):
        ref = reference_label(label, reference, position)
        if ref == label:
            continue
        base = per_run[(per_run["benchmark"] == bench) & (per_run["label"] == ref)]
        for stat in ("last", "best"):
            rows.append({"label": label, "reference": ref, "benchmark": bench, "stat": stat,
                         **delta_fields(runs, base, stat, scorer, scores, opts)})
    return pd.DataFrame(rows, columns=["label", "reference", "benchmark", "stat", *DELTA_COLUMNS])


def _cell(row) -> str:
    if row.delta_pairs == 0:
        return "n/a"
    return (f"{100 * row.delta:+.2f} [{100 * row.delta_low:+.2f}, {100 * row.delta_high:+.2f}]"
            f"{' *' if row.delta_low > 0 or row.delta_high < 0 else ''}")


def markdown(deltas: pd.DataFrame) -> str:
    """Rows: label; columns: Δ Last and Δ Best per benchmark, in percentage points; `*`
    marks an interval that excludes 0."""
    benches = sorted(deltas["benchmark"].unique())
    header = ["Cell", "vs", *(f"Δ {b} {s.title()}" for b in benches for s in ("last", "best"))]
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 2)]
    for label, g in deltas.groupby("label", sort=True):
        by = {(r.benchmark, r.stat): _cell(r) for r in g.itertuples()}
        cells = [by.get((b, s), "n/a") for b in benches for s in ("last", "best")]
        lines.append(f"| {label} | {g['reference'].iloc[0]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis within", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep-dir", required=True, help="results/<sweep> (holds runs/)")
    p.add_argument("--reference", required=True,
                   help="the axis token every cell is compared with, e.g. stale0 or corr-none")
    p.add_argument("--scorer", default=VERDICT_SCORER)
    p.add_argument("--bootstrap-reps", type=int, default=DeltaOptions.reps)
    p.add_argument("--bootstrap-seed", type=int, default=DeltaOptions.seed)
    args = p.parse_args(argv)
    if not SweepDir(args.sweep_dir).runs.is_dir():
        print(f"error: --sweep-dir {args.sweep_dir}: no runs/ folder (run the sweep first)",
              file=sys.stderr)
        return 2
    col = collect(args.sweep_dir)
    try:
        per_run = per_run_last_best(col.eval, args.scorer)
        run_dirs = dict(zip(col.runs["run_id"], col.runs["run_dir"]))
        deltas = within_deltas(per_run, run_dirs, args.scorer, args.reference,
                               DeltaOptions(reps=args.bootstrap_reps, seed=args.bootstrap_seed))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(markdown(deltas), end="")
    return 0
