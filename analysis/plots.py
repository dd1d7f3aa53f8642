"""Curves like the paper's Figure 4: evaluation accuracy and training statistics vs step.

- `accuracy_<scorer>.{png,pdf}`: Mean@n per benchmark (one panel each) vs step, from
  step 0 (the initial model, evaluated once under `<sweep>/initial/`) when it was evaluated.
- `training.{png,pdf}`: reward_mean, entropy, response_length_mean (one panel each) vs step.

One line per method (run label): the mean over seeds at each step, shaded ± one standard
error when more than one seed reached that step. A method keeps its color, marker and line
style in every figure (`method_styles`), so curves that nearly coincide stay apart; curves
that coincide exactly are drawn once, the legend naming every label they stand for. A
benchmark whose every value in the figure is the same (a tiny model's 0 on AIME24) gets no
panel, only a note under the figure. A panel whose steps evaluate different problem sets
(`eval.limit_before_last`: a cheaper curve on the first questions) draws the points not on
Last's set hollow and says so under the figure, since the line joins two populations.
Axis labels, units and percent scaling come from the
metric registry (`common.metrics.metric_meta`), never from guesses here. Rendering uses
matplotlib's object API with the Agg canvas (no pyplot state, no display needed).

Run: part of `python -m analysis report ...`; `write_plots(train_df, eval_df, out_dir)`.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from analysis.stats import seed_interval
from analysis.tables import benchmark_display, benchmark_order, label_order
from common.metrics import metric_meta

TRAIN_CURVE_METRICS = ("reward_mean", "entropy", "response_length_mean")
BAND = "line: mean over seeds, band: ± 1 standard error"
PANEL_SIZE = (4.0, 3.0)  # inches per panel; the paper's Figure 4 panels are about this shape


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
LINESTYLES = ("-", "--", "-.", ":")


def method_colors(labels) -> dict[str, tuple]:
    """label -> RGB, assigned in `label_order`; tab10 up to 10 methods, tab20 beyond (cycled).

    Pass the labels of the whole sweep so every figure shares one mapping.
    """
    ordered = label_order(labels)
    palette = matplotlib.colormaps["tab10" if len(ordered) <= 10 else "tab20"].colors
    return {lab: tuple(palette[i % len(palette)]) for i, lab in enumerate(ordered)}


def method_styles(labels) -> dict[str, tuple[str, str]]:
    """label -> (marker, line style), assigned in `label_order` like the colors: two curves
    that nearly coincide still show two markers and two dash patterns."""
    return {lab: (MARKERS[i % len(MARKERS)], LINESTYLES[i % len(LINESTYLES)])
            for i, lab in enumerate(label_order(labels))}


def constant_benchmarks(df: pd.DataFrame, metric: str, meta) -> tuple[list[str], str]:
    """(the benchmarks of `df` to draw, a note naming those left out): a benchmark whose
    every `metric` value is one and the same shows nothing a panel could, so it gets the
    note "AIME24 is not drawn: every value is 0.00." instead. When every benchmark is flat
    (a scorer no answer passes), all are drawn: there is nothing else to show."""
    keep, notes = [], []
    benches = benchmark_order(df["benchmark"])
    for bench in benches:
        values = df.loc[df["benchmark"] == bench, metric].dropna().unique()
        if len(values) == 1:
            notes.append(f"{benchmark_display(bench)} is not drawn: every value is "
                         f"{meta.format(float(values[0]))}.")
        else:
            keep.append(bench)
    return (keep, " ".join(notes)) if keep else (list(benches), "")


def coinciding(curves: dict[str, tuple[np.ndarray, np.ndarray]]) -> list[list[str]]:
    """Groups of labels whose curves are the same points (x and y equal to 1e-9), in
    label order: each group is drawn once."""
    groups: list[list[str]] = []
    for label in label_order(curves):
        x, y = curves[label]
        for g in groups:
            gx, gy = curves[g[0]]
            if len(gx) == len(x) and np.allclose(gx, x, rtol=0, atol=1e-9) \
                    and np.allclose(gy, y, rtol=0, atol=1e-9, equal_nan=True):
                g.append(label)
                break
        else:
            groups.append([label])
    return groups


def curve_label(group: list[str]) -> str:
    """The legend entry of a drawn curve: its label, or every label it stands for."""
    return group[0] if len(group) == 1 else f"{' = '.join(group)} (identical)"


def footnote(fig: Figure, note: str) -> None:
    """A one-line note under the panels: the title of the legend there (a separate text
    would collide with it), else a label of its own."""
    if not note:
        return
    if fig.legends:
        fig.legends[0].set_title(note, prop={"size": "small", "style": "italic"})
    else:
        fig.supxlabel(note, fontsize="small", style="italic")


def seed_band(df: pd.DataFrame, metric: str, smooth: int = 1) -> pd.DataFrame:
    """Per (label, step): mean over seeds, standard error (NaN with one seed) and seed count.

    df holds one row per (run_id, step) with columns label, run_id, step, `metric`.
    smooth > 1 applies a trailing rolling mean of that many logged steps within each run
    first (training curves are noisy; evaluation curves are never smoothed by the report).
    """
    d = df[["label", "run_id", "step", metric]].dropna(subset=[metric]).sort_values("step")
    if smooth > 1:
        d[metric] = d.groupby("run_id")[metric].transform(
            lambda s: s.rolling(smooth, min_periods=1).mean()
        )
    g = d.groupby(["label", "step"])[metric]
    # the standard error of analysis.stats, the same number the tables print
    out = g.agg(["mean", "count"]).rename(columns={"count": "k"})
    out["se"] = g.agg(lambda s: seed_interval(s.to_numpy()).se)
    return out.reset_index()


MIN_WIDTH = 7.0  # inches: a one-panel figure still fits its title and legend
LEGEND_ROW_INCHES = 0.22  # one row of a "small" legend


def panels(n: int) -> tuple[Figure, list]:
    fig = Figure(figsize=(max(PANEL_SIZE[0] * n, MIN_WIDTH), PANEL_SIZE[1] + 0.6),
                 layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, n, squeeze=False)[0]
    return fig, list(axes)


def isolated(se: np.ndarray) -> np.ndarray:
    """The points with a standard error but no neighbour that has one: a band between
    neighbouring points has nothing to span there (e.g. a sweep evaluated at its last step
    only, after the initial model's one-sample point)."""
    ok = np.isfinite(se)
    left = np.concatenate([[False], ok[:-1]])
    right = np.concatenate([ok[1:], [False]])
    return ok & ~left & ~right


def _draw(ax, band: pd.DataFrame, colors: dict[str, tuple], scale: float,
          markers: bool) -> None:
    """One curve per label (markers: each label's own), identical curves once."""
    styles = method_styles(colors)
    curves = {label: (band.loc[band["label"] == label, "step"].to_numpy(),
                      band.loc[band["label"] == label, "mean"].to_numpy() * scale)
              for label in band["label"].unique()}
    groups = coinciding(curves)
    steps = band["step"].to_numpy()
    # bars of different curves at one step stand side by side, 1.5% of the x range apart
    dodge = 0.015 * (steps.max() - steps.min() if len(steps) else 0)
    for i, group in enumerate(groups):
        label = group[0]
        b = band[band["label"] == label]
        x, y, se = curves[label][0], curves[label][1], b["se"].to_numpy() * scale
        marker, style = styles[label]
        ax.plot(x, y, color=colors[label], label=curve_label(group),
                marker=marker if markers else "", markersize=4, lw=1.4, ls=style)
        if np.isfinite(se).any():
            ax.fill_between(x, y - se, y + se, color=colors[label], alpha=0.2, lw=0)
            alone = isolated(se)
            if alone.any():  # a band needs two neighbouring points: these get a bar
                shift = (i - (len(groups) - 1) / 2) * dodge
                ax.errorbar(x[alone] + shift, y[alone], yerr=se[alone], fmt="none",
                            ecolor=colors[label], alpha=0.6, capsize=3, lw=1.2)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are integers


def legend(fig: Figure, axes: list, extra: list | None = None) -> None:
    """One legend under the panels: each labelled curve once, then `extra` (handle, label)
    pairs (e.g. what the markers mean)."""
    handles, labels = {}, []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in handles:
                handles[lab] = h
                labels.append(lab)
    for h, lab in extra or []:
        handles[lab] = h
        labels.append(lab)
    if labels:
        # as many columns as the widest entry leaves room for (~11 characters an inch)
        per_row = int(fig.get_figwidth() * 11) // (max(map(len, labels)) + 6)
        ncols = max(1, min(len(labels), 4, per_row))
        # the figure grows by each legend row, so a long legend (the frontier's 16 designs)
        # sits under the panels instead of squeezing them and spilling over
        fig.set_figheight(fig.get_figheight() + LEGEND_ROW_INCHES * math.ceil(len(labels) / ncols))
        fig.legend(
            [handles[lab] for lab in labels],
            labels,
            loc="outside lower center",
            ncols=ncols,
            fontsize="small",
            frameon=False,
        )


def with_initial_point(df: pd.DataFrame, initial: pd.DataFrame | None, metric: str) -> pd.DataFrame:
    """`df` (one scorer) plus the initial model's step-0 value as the first point of every
    label that has no step-0 evaluation of its own, per benchmark: every run starts from
    that model, so the line shows the gain over the warm start. `initial` holds the rows of
    `collect_initial` (None or empty: `df` unchanged)."""
    if initial is None or initial.empty:
        return df
    scorer = df["scorer"].iloc[0]
    start = initial[(initial["scorer"] == scorer)].dropna(subset=[metric])
    rows = []
    for bench, runs in df.groupby("benchmark"):
        value = start.loc[start["benchmark"] == bench, metric]
        if value.empty:
            continue
        has_step0 = set(runs.loc[runs["step"] == 0, "label"])
        problems = (start.loc[start["benchmark"] == bench, "num_problems"]
                    if "num_problems" in start else pd.Series(dtype=float))
        for label in [lab for lab in runs["label"].unique() if lab not in has_step0]:
            rows.append({"label": label, "run_id": f"initial:{label}", "step": 0,
                         "benchmark": bench, "scorer": scorer, metric: float(value.iloc[0]),
                         "num_problems": problems.iloc[0] if len(problems) else np.nan})
    return pd.concat([df, pd.DataFrame(rows)], ignore_index=True) if rows else df


def problem_sets(df: pd.DataFrame) -> pd.Series:
    """{step: problem count} of one benchmark's evaluations, by step (empty when the count
    is unknown)."""
    if "num_problems" not in df:
        return pd.Series(dtype=float)
    return df.dropna(subset=["num_problems"]).groupby("step")["num_problems"].max()


def _hollow(ax, band: pd.DataFrame, steps, colors: dict[str, tuple], scale: float) -> None:
    """Each label's points at `steps` drawn again as hollow markers (another problem set)."""
    styles = method_styles(colors)
    for label, points in band[band["step"].isin(steps)].groupby("label"):
        ax.plot(points["step"], points["mean"] * scale, ls="", marker=styles[label][0],
                markersize=4, markerfacecolor="white", markeredgecolor=colors[label],
                zorder=3)


def problem_set_note(bench: str, others: pd.Series, last: int) -> str:
    steps = ", ".join(str(int(s)) for s in others.index)
    counts = "/".join(sorted({str(int(c)) for c in others}))
    return (f"{benchmark_display(bench)}: hollow points (steps {steps}) are {counts} problems, "
            f"filled ones Last's {last}: the line joins two problem sets")


def plot_accuracy(
    eval_df: pd.DataFrame, scorer: str, colors: dict[str, tuple], metric: str = "mean",
    initial: pd.DataFrame | None = None,
) -> Figure:
    """One panel per benchmark whose values vary: `metric` of `scorer` vs step, one line per
    label, starting at step 0 from the initial model's evaluation when `initial` holds it;
    the benchmarks left out are named under the figure."""
    meta = metric_meta(metric)
    df = eval_df[eval_df["scorer"] == scorer]
    if df.empty:
        raise ValueError(f"no evaluation rows for scorer {scorer!r}")
    df = with_initial_point(df, initial, metric)
    benches, note = constant_benchmarks(df, metric, meta)
    fig, axes = panels(len(benches))
    ns = sorted({int(x) for x in df["n"].dropna()}) if "n" in df else []
    name = meta.display.replace("@n", f"@{ns[0]}") if len(ns) == 1 else meta.display
    notes = [note] if note else []
    for ax, bench in zip(axes, benches):
        rows = df[df["benchmark"] == bench]
        band = seed_band(rows, metric)
        _draw(ax, band, colors, meta.scale, markers=True)
        sizes = problem_sets(rows)
        others = sizes[sizes != sizes.iloc[-1]] if len(sizes) else sizes  # not Last's set
        if len(others):
            _hollow(ax, band, others.index, colors, meta.scale)
            notes.append(problem_set_note(bench, others, int(sizes.iloc[-1])))
        ax.set_title(benchmark_display(bench))
        ax.set_xlabel("Step")
        ax.set_ylabel(meta.axis_label().replace(meta.display, name))
        ax.grid(alpha=0.3)
    bars = any(isinstance(c, ErrorbarContainer) for ax in axes for c in ax.containers)
    spread = BAND.replace("band:", "band (bar at a lone point):") if bars else BAND
    fig.suptitle(f"Evaluation accuracy ({scorer} scorer)\n{spread}", fontsize="medium")
    legend(fig, axes)
    footnote(fig, "\n".join(notes))
    return fig


def plot_training(
    train_df: pd.DataFrame, colors: dict[str, tuple], metrics=TRAIN_CURVE_METRICS, smooth: int = 1
) -> Figure:
    """One panel per training metric vs step, one line per label. Metrics absent from
    `train_df` raise ValueError naming them (the trainer did not log them)."""
    missing = [m for m in metrics if m not in train_df.columns]
    if missing:
        raise ValueError(f"training metrics {missing} not found in metrics.jsonl columns")
    fig, axes = panels(len(metrics))
    for ax, metric in zip(axes, metrics):
        meta = metric_meta(metric)
        _draw(ax, seed_band(train_df, metric, smooth), colors, meta.scale, markers=False)
        ax.set_title(meta.display)
        ax.set_xlabel("Step")
        ax.set_ylabel(meta.axis_label())
        ax.grid(alpha=0.3)
    title = "Training dynamics" + (f" (rolling mean over {smooth} steps)" if smooth > 1 else "")
    fig.suptitle(f"{title}\n{BAND}", fontsize="medium")
    legend(fig, axes)
    return fig


def save_figure(fig: Figure, stem: Path) -> list[Path]:
    """Write `<stem>.png` (150 dpi) and `<stem>.pdf`; metadata dates are dropped so the
    same data gives byte-identical PDFs."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    png, pdf = stem.with_suffix(".png"), stem.with_suffix(".pdf")
    fig.savefig(png, dpi=150)
    fig.savefig(pdf, metadata={"CreationDate": None, "ModDate": None})
    return [png, pdf]


def write_plots(
    train_df: pd.DataFrame, eval_df: pd.DataFrame, out_dir: str | Path, smooth: int = 1,
    initial: pd.DataFrame | None = None,
) -> dict[str, list[Path]]:
    """All figures of a sweep into `out_dir`: {"accuracy_<scorer>"|"training": [png, pdf]}.

    Figures whose data is absent are not written (no evals yet -> no accuracy figure).
    `initial` (the initial model's step-0 rows) starts each accuracy curve at step 0.
    """
    out_dir = Path(out_dir)
    labels = set(train_df.get("label", [])) | set(eval_df.get("label", []))
    colors = method_colors(labels)
    written: dict[str, list[Path]] = {}
    if not eval_df.empty:
        for scorer in sorted(eval_df["scorer"].unique()):
            fig = plot_accuracy(eval_df, scorer, colors, initial=initial)
            written[f"accuracy_{scorer}"] = save_figure(fig, out_dir / f"accuracy_{scorer}")
    present = [m for m in TRAIN_CURVE_METRICS if m in train_df.columns]
    if not train_df.empty and present:
        fig = plot_training(train_df, colors, present, smooth)
        written["training"] = save_figure(fig, out_dir / "training")
    return written
