"""Last/Best result tables (the paper's Table 3 layout) with seed intervals and Δ vs a baseline.

Rows are methods (the run `label`), columns are benchmark x {Last, Best}:
  Last = the metric (Mean@n by default) at a run's final evaluated step,
  Best = its best value over the run's evaluated steps (max, or min for a metric whose
         metadata says lower is better),
each computed per seed, then summarised over seeds (`analysis.stats.seed_interval`): the
cell reads "mean ± se [low, high]", the standard error and the 95% t interval over seeds
(clipped to [0, 100]); with one seed both are "n/a". Next to each, "Δ vs <baseline>"
(`analysis.delta`; the baseline is `DeltaOptions.baseline`, DAPO by default) is the
difference to the baseline method paired by seed, the training run as the unit: at Last
with its 95% paired t interval over seeds and its Holm-adjusted p value over the table's
Last comparisons; at Best a point estimate only (Best is selected after the fact). With one
seed there is no interval. Accuracies are shown in percent with two decimals (0.59375 ->
59.38), as in the paper; Δ in percentage points; the CSV keeps fractions. Beside each
benchmark's Last, "KL Last" is the KL to the initial model that the Last checkpoint paid
(eval/kl.py: the k1 estimate on its own evaluation samples, nats per response), per seed and
then mean ± se [95% t interval, clipped at 0] over seeds; the CSV has it for Best's step too.

Per column the best displayed mean is bold and the second best underlined (dense ranking on
the rounded, displayed numbers: everything tied at the top is bold, everything tied at the
next distinct value is underlined; a column with fewer than two numbers gets no marks).

Run: part of `python -m analysis report ...`. Library: `last_best_tables(eval_df, metric,
scores=..., delta=...)` gives {scorer: tidy table} (metric "mean" = Mean@n unless told);
`write_last_best_tables(tables, out_dir)` writes each as `table_stem(scorer, metric)` +
`.{csv,md,tex}` (`last_best_<scorer>`, with `_<metric>` for another metric).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.delta import (
    DELTA_COLUMNS,
    TESTED_STAT,
    DeltaOptions,
    Scores,
    deltas_vs_baseline,
    family_size,
    row_state,
)
from analysis.stats import outside, seed_interval
from common.metrics import MetricMeta, metric_meta
from eval.benchmarks import BENCHMARKS

STATS = ("last", "best")
KL_METRIC = "kl_to_initial_k1"  # the KL the tables show: unbiased, in nats per response
KL_COLUMNS = ("kl", "kl_se", "kl_ci95_low", "kl_ci95_high")


# ---------------------------------------------------------------------------------------
# Last / Best numbers
# ---------------------------------------------------------------------------------------


def benchmark_order(benchmarks) -> list[str]:
    """Registered benchmarks in the evaluation registry's order, then any others
    alphabetically (an older sweep may hold names the registry no longer has)."""
    names = set(benchmarks)
    return [b for b in BENCHMARKS if b in names] + sorted(names - set(BENCHMARKS))


def benchmark_display(name: str) -> str:
    """A column heading: "AIME24" for an acronym with a year ("aime24"), else "Toy"."""
    return name.upper() if name[-1:].isdigit() else name.replace("_", " ").title()


def label_order(labels) -> list[str]:
    """Row order of methods: case-insensitive alphabetical (stable across tables and plots)."""
    return sorted(set(labels), key=lambda s: (s.lower(), s))


def per_run_last_best(eval_df: pd.DataFrame, scorer: str, metric: str = "mean") -> pd.DataFrame:
    """One row per (run_id, benchmark) of `scorer`: label, seed, last, best, last_step,
    best_step, n, kl_last, kl_best (the KL to the initial model at those steps; NaN without
    one). Raises ValueError if two runs share (label, seed): labels name grid cells."""
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
        # Best is over the evaluations of Last's problem set only: a cheaper curve that
        # evaluates a subset before Last (eval.limit_before_last) is another quantity
        same_set = (g["num_problems"].to_numpy() == g["num_problems"].iloc[-1]
                    if "num_problems" in g and g["num_problems"].notna().all()
                    else np.ones(len(g), dtype=bool))
        i_best = int(pick(np.where(same_set, values, np.nan)))
        kl = (g[KL_METRIC].astype(float).to_numpy() if KL_METRIC in g
              else np.full(len(g), np.nan))
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
                "kl_last": float(kl[-1]),
                "kl_best": float(kl[i_best]),
            }
        )
    return pd.DataFrame(rows)


def _seed_rows(runs: pd.DataFrame, scorer: str, metric: str) -> list[dict]:
    """One dict per (label, benchmark, stat): the seed summary of the per-run values."""
    rows = []
    bounds, kl_bounds = metric_meta(metric).value_range, metric_meta(KL_METRIC).value_range
    for (label, bench), g in runs.groupby(["label", "benchmark"], sort=False):
        ns = sorted({int(x) for x in g["n"].dropna()}) if "n" in g else []
        for stat in STATS:
            s = seed_interval(g[stat].to_numpy(dtype=float), bounds=bounds)
            kl = g[f"kl_{stat}"].to_numpy(dtype=float)
            k = seed_interval(kl, bounds=kl_bounds) if np.isfinite(kl).all() else None
            rows.append(
                {
                    "scorer": scorer,
                    "metric": metric,
                    "label": label,
                    "benchmark": bench,
                    "stat": stat,
                    "mean": s.mean,
                    "se": s.se,
                    "ci95_low": s.low,
                    "ci95_high": s.high,
                    "n_seeds": s.k,
                    "seeds": " ".join(str(x) for x in sorted(g["seed"])),
                    "last_step_min": int(g["last_step"].min()),
                    "last_step_max": int(g["last_step"].max()),
                    "n": ns[0] if len(ns) == 1 else "",
                    **dict(zip(KL_COLUMNS, (k.mean, k.se, k.low, k.high) if k else
                               (math.nan,) * len(KL_COLUMNS))),
                }
            )
    return rows


def last_best_table(
    eval_df: pd.DataFrame,
    scorer: str,
    metric: str = "mean",
    *,
    scores: Scores | None = None,
    delta: DeltaOptions | None = None,
) -> pd.DataFrame:
    """Tidy Last/Best numbers: one row per (label, benchmark, stat) with columns scorer,
    metric, label, benchmark, stat ("last"|"best"), mean, se, ci95_low, ci95_high, n_seeds,
    seeds, last_step_min, last_step_max, n (samples per problem; "" when mixed), kl, kl_se,
    kl_ci95_low, kl_ci95_high (KL to the initial model at the stat's step over seeds; NaN
    when a seed has none), baseline, and analysis.delta's DELTA_COLUMNS. Values are
    fractions.

    The Δ columns need the per-problem scores (`scores`) and the Mean@n metric; otherwise,
    and for the baseline's own rows, they are NaN.
    """
    runs = per_run_last_best(eval_df, scorer, metric)
    if runs.empty:
        raise ValueError(f"scorer {scorer!r}: every {metric!r} value is missing (NaN)")
    tidy = pd.DataFrame(_seed_rows(runs, scorer, metric))
    delta = delta or DeltaOptions()
    tidy["baseline"] = delta.baseline
    if scores is not None and metric == "mean":
        deltas = deltas_vs_baseline(runs, scores, scorer, delta, STATS)
        tidy = tidy.merge(deltas, on=["label", "benchmark", "stat"], how="left")
    for col in DELTA_COLUMNS:  # numeric even when no Δ was computed (an empty merge)
        tidy[col] = pd.to_numeric(tidy[col]) if col in tidy else math.nan
    for col in ("delta_seeds", "delta_problems"):
        tidy[col] = tidy[col].fillna(0).astype(int)
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


# after a cell whose mean lies outside its interval, clipped to the quantity's range (a k1
# KL estimate below 0): the caption says why
OUTSIDE_MARK = "†"


def format_cell(mean: float, se: float, n_seeds: int, meta: MetricMeta, pm: str, *,
                interval: tuple[float, float] | None = None, show_na: bool = False) -> str:
    """"59.38 ± 1.20" (and " [55.1, 63.6]" with `interval`) from fractions; one seed shows
    just the mean, or "59.38 ± n/a" with `show_na`; a missing mean is "–"."""
    if mean is None or math.isnan(mean):
        return "–"
    text = meta.format(mean)
    if n_seeds > 1 and not math.isnan(se):
        if se == 0:  # "0.00 ± 0.00 [0.00, 0.00]" would read as a test; the verdict says so
            return f"{text} (all {n_seeds} seeds equal)"
        text += f" {pm} {meta.format(se)}"
        if interval is not None and interval[0] == interval[1]:
            # clipped to one end of the range (a wholly negative k1 KL): no interval at all
            return f"{text} (its interval lies wholly beyond {meta.format(interval[0])}: none)"
        if interval is not None:
            text += f" [{meta.format(interval[0])}, {meta.format(interval[1])}]"
            text += OUTSIDE_MARK if outside(mean, *interval) else ""
    elif show_na:
        text += f" {pm} n/a"
    return text


def signed(value: float, meta: MetricMeta) -> str:
    """A difference with its sign: "+1.04", "-7.50", "0.00" (no sign when it shows as
    zero, so a -0.0 from a quantile never prints as "-0.00"); "–" for NaN."""
    text = meta.format(value)
    if text == "–" or float(text) == 0:
        return text.lstrip("-")
    return text if text.startswith("-") else "+" + text


def format_p(p: float) -> str:
    """A p value as printed: "0.012", "<0.001"; "n/a" for NaN."""
    if p is None or math.isnan(p):
        return "n/a"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def format_delta(delta: float, low: float, high: float, meta: MetricMeta,
                 p_holm: float = math.nan, state: str = "tested", seeds: int = 0) -> str:
    """"+4.17 [+1.04, +7.29] (Holm p 0.012)" (percentage points for a percent metric); just
    the signed Δ without an interval (Best, one seed); "n/a" for NaN. `state` (a
    `analysis.stats.DELTA_STATES` key) names the untestable ones: "0.00 (nothing to test)",
    "+12.50 (constant over 3 seeds)", never a degenerate interval that reads as a test."""
    if delta is None or math.isnan(delta):
        return "n/a"
    if state == "nothing to test":
        return f"{signed(delta, meta)} (nothing to test)"
    if state == "constant":
        return f"{signed(delta, meta)} (constant over {seeds} seeds)"
    if math.isnan(low):
        return signed(delta, meta)
    text = f"{signed(delta, meta)} [{signed(low, meta)}, {signed(high, meta)}]"
    return text if math.isnan(p_holm) else f"{text} (Holm p {format_p(p_holm)})"


@dataclass
class WideTable:
    """A tidy Last/Best table pivoted for display.

    `rows[label][(bench, stat)]` is that tidy row; `columns` lists (bench, stat, kind) in
    display order, kind "value" (mean ± se [interval]), "delta" (Δ vs the baseline, only
    when some Δ was computed) or "kl" (the KL to the initial model, Last only, when some
    run has one)."""

    labels: list[str]
    columns: list[tuple[str, str, str]]
    rows: dict[str, dict[tuple[str, str], object]]
    meta: MetricMeta
    baseline: str

    @classmethod
    def from_tidy(cls, tidy: pd.DataFrame) -> WideTable:
        meta = metric_meta(str(tidy["metric"].iloc[0]))
        labels = label_order(tidy["label"])
        kinds = ("value", "delta") if tidy["delta"].notna().any() else ("value",)
        has_kl = "kl" in tidy and tidy.loc[tidy["stat"] == "last", "kl"].notna().any()
        columns = [(b, s, k) for b in benchmark_order(tidy["benchmark"]) for s in STATS
                   for k in kinds + (("kl",) if has_kl and s == "last" else ())]
        rows: dict = {lab: {} for lab in labels}
        for r in tidy.itertuples():
            rows[r.label][(r.benchmark, r.stat)] = r
        return cls(labels, columns, rows, meta, str(tidy["baseline"].iloc[0]))

    @property
    def has_delta(self) -> bool:
        return any(kind == "delta" for _, _, kind in self.columns)

    def heading(self, col: tuple[str, str, str]) -> str:
        bench, stat, kind = col
        name = f"{benchmark_display(bench)} {stat.title()}"
        return {"value": name, "delta": f"Δ {name}", "kl": f"KL {name}"}[kind]

    def marks(self) -> dict[tuple[str, tuple[str, str, str]], str]:
        """best/second marks of the value columns (none on Δ columns)."""
        out = {}
        for col in self.columns:
            cells = [self.rows[lab].get(col[:2]) for lab in self.labels]
            means = [math.nan if r is None else r.mean for r in cells]
            marks = rank_marks(means, self.meta) if col[2] == "value" else [""] * len(means)
            out.update({(lab, col): mark for lab, mark in zip(self.labels, marks)})
        return out

    def text(self, label: str, col: tuple[str, str, str], pm: str) -> str:
        r = self.rows[label].get(col[:2])
        if r is None:
            return "–"
        if col[2] == "value":
            return format_cell(r.mean, r.se, r.n_seeds, self.meta, pm,
                               interval=(r.ci95_low, r.ci95_high), show_na=True)
        if col[2] == "kl":
            return format_cell(r.kl, r.kl_se, r.n_seeds, metric_meta(KL_METRIC), pm,
                               interval=(r.kl_ci95_low, r.kl_ci95_high))
        if label == self.baseline:
            return "baseline"
        return format_delta(r.delta, r.delta_low, r.delta_high, self.meta, r.delta_p_holm,
                            row_state(r), int(r.delta_seeds))


def metric_name(tidy: pd.DataFrame) -> str:
    """The table's metric as displayed: "Mean@4" when every run sampled n = 4, else "Mean@n"
    with the n values listed."""
    meta = metric_meta(str(tidy["metric"].iloc[0]))
    ns = sorted({int(x) for x in tidy["n"] if x != "" and not pd.isna(x)})
    if len(ns) == 1:
        return meta.display.replace("@n", f"@{ns[0]}")
    if len(ns) > 1:
        return f"{meta.display} (n differs across runs: {', '.join(map(str, ns))})"
    return meta.display


def caption(tidy: pd.DataFrame) -> str:
    """Plain-text caption: scorer, metric, unit, n, seeds, Last/Best, intervals, Δ, marks."""
    meta = metric_meta(str(tidy["metric"].iloc[0]))
    scorer = tidy["scorer"].iloc[0]
    name = metric_name(tidy)
    unit = "in percent, two decimals" if meta.fmt == "percent" else f"({meta.fmt})"
    seeds = sorted(set(tidy["n_seeds"]))
    seeds_txt = f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]} to {seeds[-1]}"
    lo, hi = int(tidy["last_step_min"].min()), int(tidy["last_step_max"].max())
    steps = f"final evaluated step {lo}" if lo == hi else f"final evaluated steps {lo}-{hi}"
    text = (
        f"Scorer {scorer}: {name} {unit}. Last = value at the run's final evaluated step "
        f"({steps}); Best = best over the steps evaluated on Last's problems; both per seed, "
        f"then mean ± standard error [95% t interval, clipped to 0-100] over seeds ({seeds_txt} seed(s) per method; "
        "n/a: one seed, no spread to estimate). Bold: best per column; underlined: second "
        "best; ties share the mark."
    )
    return text + " " + _delta_caption(tidy) + _kl_caption(tidy)


def _kl_caption(tidy: pd.DataFrame) -> str:
    if "kl" not in tidy or not tidy.loc[tidy["stat"] == "last", "kl"].notna().any():
        return ""
    last = tidy[(tidy["stat"] == "last") & tidy["kl"].notna()]
    below = any(outside(r.kl, r.kl_ci95_low, r.kl_ci95_high) and r.kl_ci95_low != r.kl_ci95_high
                for r in last.itertuples())  # a collapsed interval's cell says so itself
    return (" KL Last = KL(pi_ckpt || pi_init) to the initial model at the Last checkpoint, "
            "in nats per response (k1 on its own evaluation samples), mean ± standard error "
            "[95% t interval, clipped at 0: a KL cannot be negative] over seeds; – where a "
            "run has no KL." + (f" {OUTSIDE_MARK}: the k1 mean is below 0 (a sampling estimate "
                                "of a KL can be), outside its interval clipped at 0."
                                if below else ""))


def _delta_caption(tidy: pd.DataFrame) -> str:
    baseline = str(tidy["baseline"].iloc[0])
    if tidy["delta"].notna().any():
        tested = tidy[tidy["stat"] == TESTED_STAT]
        seeds = tested.loc[tested["delta_seeds"] > 0, "delta_seeds"]
        problems = tested.loc[tested["delta_problems"] > 0, "delta_problems"]
        k = family_size(tested)
        return (
            f"Δ = method - {baseline} (percentage points), paired by seed: each seed's Δ "
            f"averages the {_span(problems)} problem(s) both runs answered, and the 95% "
            f"paired t interval is over the {_span(seeds)} seed(s) both ran (the training "
            f"run is the unit). In brackets at Last: Holm's adjusted p value over the K = {k} "
            "Last comparison(s) of this table that vary; a Δ with Holm p < 0.05 is a finding, "
            "an interval that excludes 0 without it separates unadjusted only; one seed gives "
            "no interval. Best is a maximum over evaluated steps chosen after seeing them, so "
            "it is biased upwards: its Δ is a point estimate, not a test."
        )
    if baseline not in set(tidy["label"]):
        return f"No Δ column: the baseline {baseline} is not in this sweep."
    return f"No Δ column: no per-problem records to pair with {baseline}."


def _span(values: pd.Series) -> str:
    """"3" or "3-5" of a column of counts ("0" when empty)."""
    if values.empty:
        return "0"
    lo, hi = int(values.min()), int(values.max())
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def md_escape(text: str) -> str:
    """A label safe inside a Markdown pipe-table cell."""
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
    header = ["Method"] + [wide.heading(col) for col in wide.columns]
    lines = [
        f"*{caption(tidy)}*",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" + "---:|" * len(wide.columns),
    ]
    for lab in wide.labels:
        cells = _marked_cells(wide, marks, lab, "±", best="**{}**", second="<ins>{}</ins>")
        lines.append("| " + " | ".join([md_escape(lab), *cells]) + " |")
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
    span = len(wide.columns) // len(benches)
    lines = [
        "% generated by python -m analysis report; requires \\usepackage{booktabs}",
        "\\begin{table}[t]",
        "\\centering",
        f"\\caption{{{tex_escape(caption(tidy))}}}",
        f"\\label{{tab:{label}}}",
        "\\begin{tabular}{l" + "c" * len(wide.columns) + "}",
        "\\toprule",
        "Method & "
        + " & ".join(
            f"\\multicolumn{{{span}}}{{c}}{{{tex_escape(benchmark_display(b))}}}" for b in benches
        )
        + " \\\\",
        " ".join(
            f"\\cmidrule(lr){{{2 + span * i}-{1 + span * (i + 1)}}}" for i in range(len(benches))
        ),
        " & "
        + " & ".join(tex_escape(wide.heading(c).replace(benchmark_display(c[0]) + " ", ""))
                     for c in wide.columns)
        + " \\\\",
        "\\midrule",
    ]
    for lab in wide.labels:
        cells = _marked_cells(wide, marks, lab, "$\\pm$", best="\\textbf{{{}}}",
                              second="\\underline{{{}}}")
        lines.append(" & ".join([tex_escape(lab), *cells]) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}", "\\end{table}"]
    return "\n".join(lines) + "\n"


def last_best_tables(
    eval_df: pd.DataFrame,
    metric: str = "mean",
    *,
    scores: Scores | None = None,
    delta: DeltaOptions | None = None,
) -> dict[str, pd.DataFrame]:
    """`last_best_table` of every scorer in `eval_df`, {scorer: tidy}; {} without evals."""
    if eval_df.empty:
        return {}
    return {
        scorer: last_best_table(eval_df, scorer, metric, scores=scores, delta=delta)
        for scorer in sorted(eval_df["scorer"].unique())
    }


def table_stem(scorer: str, metric: str = "mean") -> str:
    """The file name (without suffix) of a scorer's Last/Best table under `tables/`."""
    return f"last_best_{scorer}" if metric == "mean" else f"last_best_{scorer}_{metric}"


def write_last_best_tables(
    tables: dict[str, pd.DataFrame], out_dir: str | Path
) -> dict[str, dict[str, Path]]:
    """Write tables/last_best_<scorer>[_<metric>].{csv,md,tex} for every tidy table.

    Returns {scorer: {"csv"|"md"|"tex": path}}.
    """
    out_dir = Path(out_dir)
    written: dict[str, dict[str, Path]] = {}
    for scorer, tidy in tables.items():
        out_dir.mkdir(parents=True, exist_ok=True)
        metric = str(tidy["metric"].iloc[0])
        stem = table_stem(scorer, metric)
        paths = {ext: out_dir / f"{stem}.{ext}" for ext in ("csv", "md", "tex")}
        tidy.to_csv(paths["csv"], index=False)
        paths["md"].write_text(render_markdown(tidy))
        paths["tex"].write_text(render_latex(tidy, stem.replace("_", "-")))
        written[scorer] = paths
    return written
