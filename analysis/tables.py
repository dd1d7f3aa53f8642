"""Last/Best result tables (the paper's Table 3 layout) and the paper-vs-ours comparison.

Rows are methods (the run `label`), columns are benchmark x {Last, Best}:
  Last = the metric (Mean@n by default) at a run's final evaluated step,
  Best = its best value over the run's evaluated steps (max, or min for a metric whose
         metadata says lower is better),
each computed per seed, then averaged over seeds with a standard error (sample std / sqrt(k)),
shown "mean ± se" when a cell has more than one seed. Accuracies are shown in percent with two
decimals (0.59375 -> 59.38), as in the paper; the CSV keeps tidy fractions.

Per column the best displayed value is bold and the second best underlined (dense ranking on
the rounded, displayed numbers: everything tied at the top is bold, everything tied at the next
distinct value is underlined; a column with fewer than two numbers gets no marks).

Run: part of `python -m analysis report ...`; `write_last_best_tables(eval_df, out_dir)` and
`write_paper_vs_ours(...)` are the library entry points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.metrics import MetricMeta, metric_meta

BENCHMARK_ORDER = ("aime24", "aime25", "amc23", "minerva_math", "olympiadbench", "toy")
BENCHMARK_DISPLAY = {
    "aime24": "AIME24",
    "aime25": "AIME25",
    "amc23": "AMC23",
    "minerva_math": "Minerva Math",
    "olympiadbench": "OlympiadBench",
    "toy": "Toy",
}
STATS = ("last", "best")
PAPER_SETTING_KEYS = ("table", "model", "context")
REFERENCE_COLUMNS = ("table", "model", "context", "method", "benchmark", "last", "best")


# ---------------------------------------------------------------------------------------
# Last / Best numbers
# ---------------------------------------------------------------------------------------


def benchmark_order(benchmarks) -> list[str]:
    """Paper benchmarks first in the paper's order, then the rest alphabetically."""
    names = set(benchmarks)
    return [b for b in BENCHMARK_ORDER if b in names] + sorted(names - set(BENCHMARK_ORDER))


def label_order(labels) -> list[str]:
    """Row order of methods: case-insensitive alphabetical (stable across tables and plots)."""
    return sorted(set(labels), key=lambda s: (s.lower(), s))


def per_run_last_best(eval_df: pd.DataFrame, scorer: str, metric: str = "mean") -> pd.DataFrame:
    """One row per (run_id, benchmark) of `scorer`: label, seed, last, best, last_step,
    best_step, n. Raises ValueError if two runs share (label, seed): labels name grid cells."""
    meta = metric_meta(metric)
    df = eval_df[eval_df["scorer"] == scorer]
    if df.empty:
        raise ValueError(f"no evaluation rows for scorer {scorer!r}")
    if metric not in df.columns:
        raise ValueError(f"metric {metric!r} is not a column of the evaluation data")
    clash = df.groupby(["label", "seed"])["run_id"].nunique()
    clash = clash[clash > 1]
    if not clash.empty:
        label, seed = clash.index[0]
        ids = sorted(df[(df["label"] == label) & (df["seed"] == seed)]["run_id"].unique())
        raise ValueError(
            f"runs {ids} share label {label!r} and seed {seed}; give each grid cell its own "
            "label (config.yaml 'label') so tables do not merge different settings"
        )
    rows = []
    for (run_id, bench), g in df.groupby(["run_id", "benchmark"], sort=True):
        g = g.sort_values("step")
        values = g[metric].astype(float).to_numpy()
        pick = np.nanargmin if meta.higher_is_better is False else np.nanargmax
        if np.all(np.isnan(values)):
            continue
        i_best = int(pick(values))
        rows.append(
            {
                "run_id": run_id,
                "label": g["label"].iloc[0],
                "seed": int(g["seed"].iloc[0]),
                "benchmark": bench,
                "last": float(values[-1]),
                "best": float(values[i_best]),
                "last_step": int(g["step"].iloc[-1]),
                "best_step": int(g["step"].iloc[i_best]),
                "n": g["n"].iloc[-1] if "n" in g.columns else None,
            }
        )
    return pd.DataFrame(rows)


def _se(values: np.ndarray) -> float:
    """Standard error of the mean over seeds (sample std, ddof=1); NaN for one seed."""
    return float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else math.nan


def last_best_table(eval_df: pd.DataFrame, scorer: str, metric: str = "mean") -> pd.DataFrame:
    """Tidy Last/Best numbers: one row per (label, benchmark, stat) with columns scorer,
    metric, label, benchmark, stat ("last"|"best"), mean, se, n_seeds, seeds, last_step_min,
    last_step_max, n (samples per problem; "" when mixed). Values are fractions."""
    runs = per_run_last_best(eval_df, scorer, metric)
    if runs.empty:
        raise ValueError(f"scorer {scorer!r}: every {metric!r} value is missing (NaN)")
    rows = []
    for (label, bench), g in runs.groupby(["label", "benchmark"], sort=False):
        ns = sorted({int(x) for x in g["n"].dropna()}) if "n" in g else []
        for stat in STATS:
            vals = g[stat].to_numpy(dtype=float)
            rows.append(
                {
                    "scorer": scorer,
                    "metric": metric,
                    "label": label,
                    "benchmark": bench,
                    "stat": stat,
                    "mean": float(np.mean(vals)),
                    "se": _se(vals),
                    "n_seeds": len(vals),
                    "seeds": " ".join(str(s) for s in sorted(g["seed"])),
                    "last_step_min": int(g["last_step"].min()),
                    "last_step_max": int(g["last_step"].max()),
                    "n": ns[0] if len(ns) == 1 else "",
                }
            )
    tidy = pd.DataFrame(rows)
    ranks = {
        "label": {lab: i for i, lab in enumerate(label_order(tidy["label"]))},
        "benchmark": {b: i for i, b in enumerate(benchmark_order(tidy["benchmark"]))},
        "stat": {s: i for i, s in enumerate(STATS)},
    }
    tidy = tidy.sort_values(list(ranks), key=lambda col: col.map(ranks[col.name]))
    return tidy.reset_index(drop=True)


# ---------------------------------------------------------------------------------------
# Ranking and rendering
# ---------------------------------------------------------------------------------------


def rank_marks(values: list[float], meta: MetricMeta) -> list[str]:
    """Mark per value ("best" / "second" / ""): dense ranking of the displayed (rounded)
    numbers in the metric's direction. NaNs get ""; fewer than two numbers -> no marks."""
    shown = [None if v is None or math.isnan(v) else float(meta.format(v)) for v in values]
    distinct = sorted(
        {s for s in shown if s is not None}, reverse=meta.higher_is_better is not False
    )
    if meta.higher_is_better is None or sum(s is not None for s in shown) < 2:
        return [""] * len(values)
    best = distinct[0]
    second = distinct[1] if len(distinct) > 1 else None
    return [
        "best" if s == best else "second" if s is not None and s == second else "" for s in shown
    ]


def _cell(mean: float, se: float, n_seeds: int, meta: MetricMeta, pm: str) -> str:
    if mean is None or math.isnan(mean):
        return "–"
    text = meta.format(mean)
    if n_seeds > 1 and not math.isnan(se):
        text += f" {pm} {meta.format(se)}"
    return text


@dataclass
class WideTable:
    """A tidy Last/Best table pivoted for display: `cells[label][(bench, stat)]` holds
    (mean, se, n_seeds); `labels` and `columns` give the order."""

    labels: list[str]
    columns: list[tuple[str, str]]
    cells: dict[str, dict[tuple[str, str], tuple[float, float, int]]]
    meta: MetricMeta

    @classmethod
    def from_tidy(cls, tidy: pd.DataFrame) -> WideTable:
        meta = metric_meta(str(tidy["metric"].iloc[0]))
        labels = label_order(tidy["label"])
        columns = [(b, s) for b in benchmark_order(tidy["benchmark"]) for s in STATS]
        cells: dict = {lab: {} for lab in labels}
        for r in tidy.itertuples():
            cells[r.label][(r.benchmark, r.stat)] = (r.mean, r.se, r.n_seeds)
        return cls(labels, columns, cells, meta)

    def marks(self) -> dict[tuple[str, tuple[str, str]], str]:
        out = {}
        for col in self.columns:
            vals = [self.cells[lab].get(col, (math.nan,))[0] for lab in self.labels]
            for lab, mark in zip(self.labels, rank_marks(vals, self.meta)):
                out[(lab, col)] = mark
        return out

    def text(self, label: str, col: tuple[str, str], pm: str) -> str:
        mean, se, k = self.cells[label].get(col, (math.nan, math.nan, 0))
        return _cell(mean, se, k, self.meta, pm)


def caption(tidy: pd.DataFrame) -> str:
    """Plain-text caption: scorer, metric, unit, n, seeds, Last/Best and mark conventions."""
    meta = metric_meta(str(tidy["metric"].iloc[0]))
    scorer = tidy["scorer"].iloc[0]
    ns = sorted({int(x) for x in tidy["n"] if x != "" and not pd.isna(x)})
    name = meta.display.replace("@n", f"@{ns[0]}") if len(ns) == 1 else meta.display
    if len(ns) > 1:
        name += f" (n differs across runs: {', '.join(map(str, ns))})"
    unit = "in percent, two decimals" if meta.fmt == "percent" else f"({meta.fmt})"
    seeds = sorted(set(tidy["n_seeds"]))
    seeds_txt = f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]} to {seeds[-1]}"
    lo, hi = int(tidy["last_step_min"].min()), int(tidy["last_step_max"].max())
    steps = f"final evaluated step {lo}" if lo == hi else f"final evaluated steps {lo}-{hi}"
    return (
        f"Scorer {scorer}: {name} {unit}. Last = value at the run's final evaluated step "
        f"({steps}); Best = best over evaluated steps; both per seed, then mean ± standard "
        f"error over seeds ({seeds_txt} seed(s) per method). Bold: best per column; "
        "underlined: second best; ties share the mark."
    )


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")



def _marked_cells(wide, marks, lab, pm: str, *, best: str, second: str) -> list[str]:
    """One row's cell texts with the best/second marks applied through format strings."""
    formats = {"best": best, "second": second}
    return [formats.get(marks[(lab, col)], "{}").format(wide.text(lab, col, pm))
            for col in wide.columns]

def render_markdown(tidy: pd.DataFrame) -> str:
    """A pipe table (bold `**x**`, underline `<ins>x</ins>`) preceded by its caption."""
    wide = WideTable.from_tidy(tidy)
    marks = wide.marks()
    header = ["Method"] + [f"{BENCHMARK_DISPLAY.get(b, b)} {s.title()}" for b, s in wide.columns]
    lines = [
        f"*{caption(tidy)}*",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" + "---:|" * len(wide.columns),
    ]
    for lab in wide.labels:
        cells = _marked_cells(wide, marks, lab, "±", best="**{}**", second="<ins>{}</ins>")
        lines.append("| " + " | ".join([_md_escape(lab), *cells]) + " |")
    return "\n".join(lines) + "\n"


_TEX_SPECIAL = {
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "\\": r"\textbackslash{}",
    "±": r"$\pm$",
    "−": r"$-$",
    "Δ": r"$\Delta$",
}


def tex_escape(text: str) -> str:
    """Escape LaTeX special characters in a label or caption."""
    return "".join(_TEX_SPECIAL.get(ch, ch) for ch in text)


def render_latex(tidy: pd.DataFrame, label: str) -> str:
    """A booktabs `table` (needs \\usepackage{booktabs}) with \\textbf / \\underline marks."""
    wide = WideTable.from_tidy(tidy)
    marks = wide.marks()
    benches = benchmark_order(tidy["benchmark"])
    lines = [
        "% generated by python -m analysis report; requires \\usepackage{booktabs}",
        "\\begin{table}[t]",
        "\\centering",
        f"\\caption{{{tex_escape(caption(tidy))}}}",
        f"\\label{{tab:{label}}}",
        "\\begin{tabular}{l" + "cc" * len(benches) + "}",
        "\\toprule",
        "Method & "
        + " & ".join(
            f"\\multicolumn{{2}}{{c}}{{{tex_escape(BENCHMARK_DISPLAY.get(b, b))}}}" for b in benches
        )
        + " \\\\",
        " ".join(f"\\cmidrule(lr){{{2 + 2 * i}-{3 + 2 * i}}}" for i in range(len(benches))),
        " & " + " & ".join(s.title() for _, s in wide.columns) + " \\\\",
        "\\midrule",
    ]
    for lab in wide.labels:
        cells = _marked_cells(wide, marks, lab, "$\\pm$", best="\\textbf{{{}}}",
                              second="\\underline{{{}}}")
        lines.append(" & ".join([tex_escape(lab), *cells]) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}", "\\end{table}"]
    return "\n".join(lines) + "\n"


def write_last_best_tables(
    eval_df: pd.DataFrame, out_dir: str | Path, metric: str = "mean"
) -> dict[str, dict[str, Path]]:
    """Write tables/last_best_<scorer>.{csv,md,tex} for every scorer in `eval_df`.

    Returns {scorer: {"csv"|"md"|"tex": path}}; an empty eval_df writes nothing.
    """
    out_dir = Path(out_dir)
    written: dict[str, dict[str, Path]] = {}
    if eval_df.empty:
        return written
    out_dir.mkdir(parents=True, exist_ok=True)
    for scorer in sorted(eval_df["scorer"].unique()):
        tidy = last_best_table(eval_df, scorer, metric)
        stem = f"last_best_{scorer}" if metric == "mean" else f"last_best_{scorer}_{metric}"
        paths = {ext: out_dir / f"{stem}.{ext}" for ext in ("csv", "md", "tex")}
        tidy.to_csv(paths["csv"], index=False)
        paths["md"].write_text(render_markdown(tidy))
        paths["tex"].write_text(render_latex(tidy, stem.replace("_", "-")))
        written[scorer] = paths
    return written


# ---------------------------------------------------------------------------------------
# Paper vs ours
# ---------------------------------------------------------------------------------------


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


def paper_vs_ours(
    eval_df: pd.DataFrame,
    runs: pd.DataFrame,
    ref: pd.DataFrame,
    setting: dict[str, str],
    scorer: str = "dapo",
) -> PaperComparison:
    """Join our Last/Best (scorer `scorer`, the paper's) with the paper's on method+benchmark.

    Our method is the runs' `tag_method`; each label must map to one method. Output columns:
    label, method, benchmark, paper_last, ours_last, ours_last_se, diff_last, paper_best,
    ours_best, ours_best_se, diff_best, n_seeds (fractions; diff = ours - paper).
    """
    desc = ", ".join(f"{k}={v}" for k, v in setting.items())
    paper = select_paper_rows(ref, setting)
    if paper.empty:
        return PaperComparison(
            None,
            [
                f"No paper results match the setting `{desc}`; available settings: "
                + "; ".join(f"`{s}`" for s in available_settings(ref))
                + "."
            ],
        )
    if eval_df.empty or scorer not in set(eval_df["scorer"]):
        return PaperComparison(None, [f"No evaluations with the `{scorer}` scorer (the paper's)."])
    if "tag_method" not in runs.columns:
        return PaperComparison(None, ["Runs carry no `method` tag; cannot join with the paper."])
    methods = runs.groupby("label")["tag_method"].unique()
    multi = {lab: list(m) for lab, m in methods.items() if len(m) > 1}
    if multi:
        raise ValueError(f"labels map to several methods: {multi}; a label must name one cell")
    ours = last_best_table(eval_df, scorer)
    ours["method"] = ours["label"].map(lambda lab: methods[lab][0])
    keys = ["label", "method", "benchmark"]
    last = ours[ours["stat"] == "last"][[*keys, "mean", "se", "n_seeds"]]
    best = ours[ours["stat"] == "best"][[*keys, "mean", "se"]]
    wide = last.merge(best, on=keys, suffixes=("_last", "_best"))
    joined = wide.merge(paper[["method", "benchmark", "last", "best"]], on=["method", "benchmark"])
    notes = []
    not_run = sorted(set(paper["method"]) - set(ours["method"]))
    if not_run:
        notes.append("Paper methods not in this sweep: " + ", ".join(not_run) + ".")
    not_in_paper = sorted(set(ours["label"]) - set(joined["label"]))
    if not_in_paper:
        notes.append("Our methods without a paper number here: " + ", ".join(not_in_paper) + ".")
    if joined.empty:
        notes.append("No (method, benchmark) pair of this sweep appears in the paper setting.")
        return PaperComparison(None, notes)
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
    ).reset_index(drop=True)
    return PaperComparison(table, notes)


def _signed(value: float, meta: MetricMeta) -> str:
    text = meta.format(value)
    return text if text.startswith("-") or text == "–" else "+" + text


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
        ours_last = _cell(r.ours_last, r.ours_last_se, r.n_seeds, meta, "±")
        ours_best = _cell(r.ours_best, r.ours_best_se, r.n_seeds, meta, "±")
        lines.append(
            f"| {_md_escape(r.label)} | {BENCHMARK_DISPLAY.get(r.benchmark, r.benchmark)} | "
            f"{meta.format(r.paper_last)} | {ours_last} | {_signed(r.diff_last, meta)} | "
            f"{meta.format(r.paper_best)} | {ours_best} | {_signed(r.diff_best, meta)} |"
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
