"""The paper's reported numbers next to ours (results/reference/reported_results.csv).

`--paper-setting model=Qwen3-4B,context=8k[,table=3]` picks one of the paper's tables; our
Last/Best per method (the runs' `method` tag) is joined with it on (method, benchmark), and
the difference ours - paper is shown in percentage points. Nothing is guessed: a setting
that matches no table, or several tables reporting the same method and benchmark, is said
in the report (or rejected with the settings to choose from).

Run: part of `python -m analysis report ... --paper-setting ...`; `paper_vs_ours(...)` and
`write_paper_vs_ours(...)` are the library entry points.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.delta import VERDICT_SCORER
from analysis.tables import (
    benchmark_display,
    benchmark_order,
    format_cell,
    label_order,
    last_best_table,
    md_escape,
    signed,
)
from common.metrics import metric_meta

PAPER_SETTING_KEYS = ("table", "model", "context")
REFERENCE_COLUMNS = ("table", "model", "context", "method", "benchmark", "last", "best")




def parse_paper_setting(spec: str | dict | None) -> dict[str, str] | None:
    """Parse `model=Qwen3-4B,context=8k[,table=3]` (or a dict) to {key: value}; None -> None.

    Keys: table, model, context. Unknown keys and malformed items raise ValueError.
    """
    if spec is None or spec == "":
        return None
    if isinstance(spec, dict):
        items = {str(k): str(v) for k, v in spec.items()}
    else:
        items = {}
        for part in str(spec).split(","):
            key, sep, value = part.partition("=")
            if not sep or not key.strip() or not value.strip():
                raise ValueError(
                    f"--paper-setting item {part!r} is not key=value; "
                    "example: model=Qwen3-4B,context=8k"
                )
            items[key.strip()] = value.strip()
    unknown = sorted(set(items) - set(PAPER_SETTING_KEYS))
    if unknown:
        raise ValueError(
            f"--paper-setting key(s) {unknown} unknown; allowed: {list(PAPER_SETTING_KEYS)}"
        )
    if not items:
        raise ValueError("--paper-setting is empty; example: model=Qwen3-4B,context=8k")
    return items


def load_reference(path: str | Path) -> pd.DataFrame:
    """The paper's numbers (columns table, model, context, method, benchmark, last, best)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"paper reference file {path} does not exist")
    ref = pd.read_csv(path, dtype=str)
    missing = [c for c in REFERENCE_COLUMNS if c not in ref.columns]
    if missing:
        raise ValueError(f"{path} lacks column(s) {missing}; expected {list(REFERENCE_COLUMNS)}")
    for col in ("last", "best"):
        ref[col] = ref[col].astype(float)
    return ref


def available_settings(ref: pd.DataFrame) -> list[str]:
    """Every (table, model, context) in the reference, as --paper-setting strings."""
    keys = ref[list(PAPER_SETTING_KEYS)].drop_duplicates()
    return [f"table={r.table},model={r.model},context={r.context}" for r in keys.itertuples()]


def select_paper_rows(ref: pd.DataFrame, setting: dict[str, str]) -> pd.DataFrame:
    """Reference rows of one setting; empty when nothing matches. A setting that matches
    several paper tables with the same method+benchmark raises ValueError (add table=)."""
    mask = np.ones(len(ref), dtype=bool)
    for key, value in setting.items():
        mask &= (ref[key] == value).to_numpy()
    rows = ref[mask]
    clash = rows.duplicated(["method", "benchmark"], keep=False)
    if clash.any():
        tables = sorted(rows.loc[clash, "table"].unique())
        raise ValueError(
            f"--paper-setting {setting} matches paper tables {tables} that report the same "
            f"method and benchmark; narrow it with context= or table= (one of {tables})"
        )
    return rows


@dataclass
class PaperComparison:
    """The joined table (None when nothing could be joined) and notes for the report."""

    table: pd.DataFrame | None
    notes: list[str]


def _label_methods(runs: pd.DataFrame) -> pd.Series:
    """label -> the one `tag_method` of its runs; ValueError when a label maps to several."""
    methods = runs.groupby("label")["tag_method"].unique()
    multi = {lab: list(m) for lab, m in methods.items() if len(m) > 1}
    if multi:
        raise ValueError(f"labels map to several methods: {multi}; a label must name one cell")
    return methods.map(lambda m: m[0])


def _ours_wide(eval_df: pd.DataFrame, scorer: str, methods: pd.Series) -> pd.DataFrame:
    """Our Last/Best per (label, method, benchmark): mean_last, se_last, n_seeds,
    mean_best, se_best."""
    ours = last_best_table(eval_df, scorer)
    ours["method"] = ours["label"].map(methods)
    keys = ["label", "method", "benchmark"]
    last = ours[ours["stat"] == "last"][[*keys, "mean", "se", "n_seeds"]]
    best = ours[ours["stat"] == "best"][[*keys, "mean", "se"]]
    return last.merge(best, on=keys, suffixes=("_last", "_best"))


def _comparison_frame(joined: pd.DataFrame) -> pd.DataFrame:
    """The output columns of `paper_vs_ours`, in label then benchmark order."""
    table = pd.DataFrame(
        {
            "label": joined["label"],
            "method": joined["method"],
            "benchmark": joined["benchmark"],
            "paper_last": joined["last"],
            "ours_last": joined["mean_last"],
            "ours_last_se": joined["se_last"],
            "diff_last": joined["mean_last"] - joined["last"],
            "paper_best": joined["best"],
            "ours_best": joined["mean_best"],
            "ours_best_se": joined["se_best"],
            "diff_best": joined["mean_best"] - joined["best"],
            "n_seeds": joined["n_seeds"].astype(int),
        }
    )
    order = {lab: i for i, lab in enumerate(label_order(table["label"]))}
    border = {b: i for i, b in enumerate(benchmark_order(table["benchmark"]))}
    table = table.sort_values(
        ["label", "benchmark"], key=lambda s: s.map(order if s.name == "label" else border)
    )
    return table.reset_index(drop=True)


def _unavailable(eval_df, runs, ref, setting, scorer) -> str | None:
    """Why no comparison can be made, or None when it can."""
    if select_paper_rows(ref, setting).empty:
        desc = ", ".join(f"{k}={v}" for k, v in setting.items())
        known = "; ".join(f"`{s}`" for s in available_settings(ref))
        return f"No paper results match the setting `{desc}`; available settings: {known}."
    if eval_df.empty or scorer not in set(eval_df["scorer"]):
        return f"No evaluations with the `{scorer}` scorer (the paper's)."
    if "tag_method" not in runs.columns:
        return "Runs carry no `method` tag; cannot join with the paper."
    return None


def paper_vs_ours(
    eval_df: pd.DataFrame,
    runs: pd.DataFrame,
    ref: pd.DataFrame,
    setting: dict[str, str],
    scorer: str = VERDICT_SCORER,
) -> PaperComparison:
    """Join our Last/Best (scorer `scorer`, the paper's) with the paper's on method+benchmark.

    Our method is the runs' `tag_method`; each label must map to one method. Output columns:
    label, method, benchmark, paper_last, ours_last, ours_last_se, diff_last, paper_best,
    ours_best, ours_best_se, diff_best, n_seeds (fractions; diff = ours - paper).
    """
    why = _unavailable(eval_df, runs, ref, setting, scorer)
    if why is not None:
        return PaperComparison(None, [why])
    paper = select_paper_rows(ref, setting)
    wide = _ours_wide(eval_df, scorer, _label_methods(runs))
    joined = wide.merge(paper[["method", "benchmark", "last", "best"]], on=["method", "benchmark"])
    notes = []
    not_run = sorted(set(paper["method"]) - set(wide["method"]))
    if not_run:
        notes.append("Paper methods not in this sweep: " + ", ".join(not_run) + ".")
    not_in_paper = sorted(set(wide["label"]) - set(joined["label"]))
    if not_in_paper:
        notes.append("Our methods without a paper number here: " + ", ".join(not_in_paper) + ".")
    if joined.empty:
        notes.append("No (method, benchmark) pair of this sweep appears in the paper setting.")
        return PaperComparison(None, notes)
    return PaperComparison(_comparison_frame(joined), notes)


def render_paper_vs_ours_markdown(table: pd.DataFrame, setting: dict[str, str]) -> str:
    """Rows (method, benchmark); columns paper/ours/difference for Last and Best, percent."""
    meta = metric_meta("mean")
    desc = ", ".join(f"{k}={v}" for k, v in setting.items())
    lines = [
        f"*Paper ({desc}) vs ours, dapo scorer, Mean@n in percent (two decimals); "
        "Δ = ours − paper in percentage points; ours is mean ± s.e. over seeds when >1 seed.*",
        "",
        "| Method | Benchmark | Paper Last | Ours Last | Δ Last | Paper Best | Ours Best "
        "| Δ Best |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in table.itertuples():
        ours_last = format_cell(r.ours_last, r.ours_last_se, r.n_seeds, meta, "±")
        ours_best = format_cell(r.ours_best, r.ours_best_se, r.n_seeds, meta, "±")
        lines.append(
            f"| {md_escape(r.label)} | {benchmark_display(r.benchmark)} | "
            f"{meta.format(r.paper_last)} | {ours_last} | {signed(r.diff_last, meta)} | "
            f"{meta.format(r.paper_best)} | {ours_best} | {signed(r.diff_best, meta)} |"
        )
    return "\n".join(lines) + "\n"


def write_paper_vs_ours(
    comparison: PaperComparison, setting: dict[str, str], out_dir: str | Path
) -> dict[str, Path]:
    """Write tables/paper_vs_ours.{csv,md} when the comparison has a table."""
    if comparison.table is None:
        return {}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out_dir / "paper_vs_ours.csv", "md": out_dir / "paper_vs_ours.md"}
    comparison.table.to_csv(paths["csv"], index=False)
    paths["md"].write_text(render_paper_vs_ours_markdown(comparison.table, setting))
    return paths
