"""Recompute a snapshot's published numbers and sentences from what it ships, and compare.

    python -m analysis recompute docs/runs/<name> [docs/runs/<other> ...]

A snapshot (docs/runs/<name>/, or any report's output folder) ships `tables/eval_metrics.csv`
(every evaluation summary), `tables/problem_scores.csv.gz` (every per-problem score) and
`tables/initial_metrics.csv` (the initial model's scores). From those alone this rebuilds,
with the report's own code (`analysis.report.Published`):

- each `tables/last_best_<scorer>.csv` (seed intervals, Δ vs the baseline with its paired t
  interval, p and Holm p) and `tables/contrasts.csv` (an overlay's contrasts): the same
  columns, every number compared to 1e-9 and every text cell (seeds, baseline) as text;
- every evaluation mean of `tables/eval_metrics.csv` (and the initial model's, where its
  per-problem scores ship) against the mean of its per-problem scores, at every step;
- their Markdown and LaTeX renderings, `last_best_<scorer>.{md,tex}`: compared as text;
- `report.md`'s computed text: the verdict (separations, detectable sizes, warm-start gains),
  the contrasts' paragraph and table, each scorer's table and its initial-model row; each must
  appear in report.md verbatim and whole lines, from a line's start (the verdict: after the
  cross-check's lead only), so an edited or prefixed verdict fails.

It prints one line per file and exits 1 on any difference (0 otherwise, 2 when a file it
needs is missing), so a reader can check a published interval, or a sentence, without the
run folders, which no snapshot keeps.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import contrasts
from analysis.delta import VERDICT_SCORER, DeltaOptions
from analysis.report import Published, initial_rows
from analysis.snapshot import read_published
from analysis.tables import render_latex, render_markdown, table_stem
from analysis.verdict import contrast_paragraph
from common.layout import SweepDir

TOLERANCE = 1e-9  # absolute: another CPU may sum in another order (last bits)
_VERDICT_SCORER = re.compile(r"\*\*Verdict\*\* \(computed from the tables below: scorer `([^`]+)`")


def compare(published: pd.DataFrame, rebuilt: pd.DataFrame, keys: list[str]) -> list[str]:
    """The differences between two tables, row by `keys`: their column sets, every text
    column as text and every numeric one to TOLERANCE."""
    pub, new = published.set_index(keys).sort_index(), rebuilt.set_index(keys).sort_index()
    if list(pub.index) != list(new.index):
        return [f"rows differ: published {len(pub)}, recomputed {len(new)}"]
    diffs = []
    dropped = [c for c in new.columns if c not in pub.columns]
    added = [c for c in pub.columns if c not in new.columns]
    if dropped or added:
        diffs.append(f"columns differ: the published table lacks {dropped} and adds {added}")
    for col in pub.columns.intersection(new.columns):
        a = pd.to_numeric(pub[col], errors="coerce").to_numpy(dtype=float)
        b = pd.to_numeric(new[col], errors="coerce").to_numpy(dtype=float)
        if np.isnan(a).all() and pub[col].notna().any():  # a text column: as text
            x, y = (frame[col].fillna("").astype(str).to_numpy() for frame in (pub, new))
            diffs += [f"{col} at {idx}: published {u!r}, recomputed {v!r}"
                      for idx, u, v in zip(pub.index[x != y], x[x != y], y[x != y])]
            continue
        bad = ~((np.isnan(a) & np.isnan(b)) | (np.abs(a - b) <= TOLERANCE))
        diffs += [f"{col} at {idx}: published {x!r}, recomputed {y!r}"
                  for idx, x, y in zip(pub.index[bad], a[bad], b[bad])]
    return diffs


def text_diff(what: str, published: str, rebuilt: str) -> list[str]:
    """[] when equal, else one line naming where the two texts first part."""
    if published == rebuilt:
        return []
    at = next((i for i, (a, b) in enumerate(zip(published, rebuilt)) if a != b),
              min(len(published), len(rebuilt)))
    return [f"{what} differs at character {at}: published {published[at:at + 60]!r}, "
            f"recomputed {rebuilt[at:at + 60]!r}"]


# What may stand before the verdict on its line: the cross-check's lead
# (analysis.concordance.headline), nothing else.
_CROSSCHECK_LEAD = (r"(?:(?:Cross-check: lighteval agrees|\*\*Cross-check disagreement\*\*: )"
                    r"[^\n]*?\(see Concordance\)\. )?")


def missing_block(what: str, block: str, report: str, lead: str = "") -> list[str]:
    """[] when `block` appears in the report verbatim and whole, from the start of a line
    (after `lead`, a pattern, where one may stand) to the end of one; else one line saying
    what is missing: a shortened, extended or prefixed sentence is a difference too."""
    if re.search(r"^" + lead + re.escape(block.rstrip("\n")) + r"$", report, re.M):
        return []
    return [f"report.md does not state the recomputed {what}: {block[:160]!r}..."]


def asked_scorer(report: str) -> str:
    """The scorer the report's verdict was asked to read: the one its opening names (a
    `--verdict-scorer` choice), or the default when it says the default was not evaluated."""
    named = _VERDICT_SCORER.search(report)
    if named is None or f"(scorer `{VERDICT_SCORER}` was not evaluated;" in report:
        return VERDICT_SCORER
    return named.group(1)


def recomputed(folder: str | Path) -> tuple[Published, pd.DataFrame] | None:
    """(what the report's code states from a snapshot's files, its initial-model rows); None
    for a folder with no Last/Best table. The baseline is the published tables' own."""
    snap = SweepDir(folder)
    eval_df, scores, initial = read_published(folder)
    csvs = sorted(snap.tables.glob("last_best_*.csv"))
    if not csvs:
        return None
    baseline = str(pd.read_csv(csvs[0])["baseline"].iloc[0])
    report = snap.report.read_text() if snap.report.is_file() else ""
    return Published.computed(eval_df, scores, initial, DeltaOptions(baseline),
                              asked_scorer(report)), initial


_EVAL_KEYS = ["run_id", "step", "benchmark", "scorer"]


def means_against_scores(eval_df: pd.DataFrame, scores: pd.DataFrame,
                         initial: pd.DataFrame) -> tuple[int, list[str]]:
    """(means compared, differences): every evaluation's Mean@n in eval_metrics.csv (and the
    initial model's, where its per-problem scores ship) against the mean of its per-problem
    scores, at every step, those that feed no published number included."""
    per_problem = (scores.assign(acc=scores["correct"] / scores["samples"])
                   .groupby(_EVAL_KEYS)["acc"].mean().rename("from_scores").reset_index())
    rows = eval_df[_EVAL_KEYS + ["mean"]].assign(step=lambda d: d["step"].astype(int))
    if "initial" in set(per_problem["run_id"]) and not initial.empty:
        warm = initial[["step", "benchmark", "scorer", "mean"]].assign(run_id="initial")
        rows = pd.concat([rows, warm.assign(step=lambda d: d["step"].astype(int))])
    merged = rows.merge(per_problem, on=_EVAL_KEYS, how="left")
    diffs = [f"{r.run_id} step {r.step} {r.benchmark} {r.scorer}: mean {r.mean!r}, "
             + ("no per-problem scores" if pd.isna(r.from_scores)
                else f"its per-problem scores give {r.from_scores!r}")
             for r in merged.itertuples()
             if pd.isna(r.from_scores) or not abs(r.mean - r.from_scores) <= TOLERANCE]
    return len(merged), diffs


def recompute(folder: str | Path) -> list[tuple[str, int, list[str]]]:
    """(file, numbers or blocks compared, differences) per published file of a snapshot."""
    snap = SweepDir(folder)
    found = recomputed(folder)
    if found is None:
        return []
    published_text, initial = found
    report = snap.report.read_text() if snap.report.is_file() else ""
    csvs = sorted(snap.tables.glob("last_best_*.csv"))
    eval_df, scores, _ = read_published(folder)
    out = [("eval_metrics.csv", *means_against_scores(eval_df, scores.table, initial))]
    for path in csvs:
        published = pd.read_csv(path)
        scorer, metric = str(published["scorer"].iloc[0]), str(published["metric"].iloc[0])
        rebuilt = published_text.tables.get(scorer)
        if rebuilt is None or table_stem(scorer, metric) != path.stem:
            out.append((path.name, 0, [f"no recomputed table for scorer {scorer!r}"]))
            continue
        out.append((path.name, _count(published),
                    compare(published, rebuilt, ["label", "benchmark", "stat"])))
        for ext, text in (("md", render_markdown(rebuilt)),
                          ("tex", render_latex(rebuilt, path.stem.replace("_", "-")))):
            rendered = path.with_suffix(f".{ext}")
            if rendered.is_file():
                out.append((rendered.name, 1, text_diff(rendered.name, rendered.read_text(),
                                                        text)))
    rows = published_text.contrast_rows
    path = snap.tables / contrasts.CSV_NAME
    if path.is_file():
        published = pd.read_csv(path)
        if rows is None or rows.empty:
            out.append((path.name, 0, ["published, but the snapshot's scores give no contrast"]))
        else:
            out.append((path.name, _count(published),
                        compare(published, rows, ["contrast", "label", "partner"])))
    if report:
        out.append((snap.report.name, *_report_blocks(report, published_text, initial)))
    return out


def _report_blocks(report: str, pub: Published, initial: pd.DataFrame) -> tuple[int, list[str]]:
    """(blocks compared, differences) of report.md's computed text against `pub`."""
    blocks = [("verdict", pub.verdict[0])]
    if pub.contrast_rows is not None and not pub.contrast_rows.empty:
        blocks += [("contrasts paragraph", contrast_paragraph(pub.contrast_rows)),
                   ("contrasts table", contrasts.markdown(pub.contrast_rows))]
    blocks += [("accuracy by category", block) for block in pub.categories]
    blocks += [("pass@k and maj@k tables", pub.at_k)] if pub.at_k else []
    for scorer, tidy in pub.tables.items():
        blocks.append((f"`{scorer}` table", render_markdown(tidy)))
        lines = initial_rows(initial, scorer)
        if lines:
            blocks.append((f"`{scorer}` initial-model row", "\n".join(lines)))
    diffs = [d for what, block in blocks
             for d in missing_block(what, block, report,
                                    _CROSSCHECK_LEAD if what == "verdict" else "")]
    return len(blocks), diffs


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
            if name == SweepDir(folder).report.name:
                what = f"{SweepDir(folder).report}: {count} computed blocks of text"
            elif name.endswith((".md", ".tex")):
                what = f"{folder}/tables/{name}: its rendering"
            elif name == "eval_metrics.csv":
                what = (f"{folder}/tables/{name}: {count} evaluation means against their "
                        "per-problem scores")
            else:
                what = f"{folder}/tables/{name}: {count} numbers"
            print(f"{what} recomputed, {status}")
            for line in diffs[:20]:
                print(f"  {line}")
            failed |= bool(diffs)
        if not results:
            print(f"{folder}: no published table to recompute")
    return 1 if failed else 0
