"""Curves like the paper's Figure 4: evaluation accuracy and training statistics vs step.

- `accuracy_<scorer>.{png,pdf}`: Mean@n per benchmark (one panel each) vs step, from
  step 0 (the initial model, evaluated once under `<sweep>/initial/`) when it was evaluated.
- `training.{png,pdf}`: reward_mean, entropy, response_length_mean (one panel each) vs step.

One line per method (run label): the mean over seeds at each step, shaded ± one standard
error when more than one seed reached that step. A method keeps its color in every figure
(`method_colors`). Axis labels, units and percent scaling come from the metric registry
(`common.metrics.metric_meta`), never from guesses here. Rendering uses matplotlib's
object API with the Agg canvas (no pyplot state, no display needed).

Run: part of `python -m analysis report ...`; `write_plots(train_df, eval_df, out_dir)`.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from analysis.stats import seed_interval
from analysis.tables import benchmark_display, benchmark_order, label_order
from common.metrics import metric_meta

TRAIN_CURVE_METRICS = ("reward_mean", "entropy", "response_length_mean")
BAND = "line: mean over seeds, band: ± 1 standard error"
PANEL_SIZE = (4.0, 3.0)  # inches per panel; the paper's Figure 4 panels are about this shape


def method_colors(labels) -> dict[str, tuple]:
    """label -> RGB, assigned in `label_order`; tab10 up to 10 methods, tab20 beyond (cycled).

    Pass the labels of the whole sweep so every figure shares one mapping.
    """
    ordered = label_order(labels)
    palette = matplotlib.colormaps["tab10" if len(ordered) <= 10 else "tab20"].colors
    return {lab: tuple(palette[i % len(palette)]) for i, lab in enumerate(ordered)}


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


def panels(n: int) -> tuple[Figure, list]:
    fig = Figure(figsize=(PANEL_SIZE[0] * n, PANEL_SIZE[1] + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, n, squeeze=False)[0]
    return fig, list(axes)


def _draw(ax, band: pd.DataFrame, colors: dict[str, tuple], scale: float, marker: str) -> None:
    for label in label_order(band["label"]):
        b = band[band["label"] == label]
        x, y, se = b["step"].to_numpy(), b["mean"].to_numpy() * scale, b["se"].to_numpy() * scale
        ax.plot(x, y, color=colors[label], label=label, marker=marker, markersize=3, lw=1.4)
        if np.isfinite(se).any():
            ax.fill_between(x, y - se, y + se, color=colors[label], alpha=0.2, lw=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are integers


def legend(fig: Figure, axes: list) -> None:
    handles, labels = {}, []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in handles:
                handles[lab] = h
                labels.append(lab)
    if labels:
        fig.legend(
            [handles[lab] for lab in labels],
            labels,
            loc="outside lower center",
            ncols=min(len(labels), 4),
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
        for label in [lab for lab in runs["label"].unique() if lab not in has_step0]:
            rows.append({"label": label, "run_id": f"initial:{label}", "step": 0,
                         "benchmark": bench, "scorer": scorer, metric: float(value.iloc[0])})
    return pd.concat([df, pd.DataFrame(rows)], ignore_index=True) if rows else df


def plot_accuracy(
    eval_df: pd.DataFrame, scorer: str, colors: dict[str, tuple], metric: str = "mean",
    initial: pd.DataFrame | None = None,
) -> Figure:
    """One panel per benchmark: `metric` of `scorer` vs step, one line per label, starting
    at step 0 from the initial model's evaluation when `initial` holds it."""
    meta = metric_meta(metric)
    df = eval_df[eval_df["scorer"] == scorer]
    if df.empty:
        raise ValueError(f"no evaluation rows for scorer {scorer!r}")
    df = with_initial_point(df, initial, metric)
    benches = benchmark_order(df["benchmark"])
    fig, axes = panels(len(benches))
    ns = sorted({int(x) for x in df["n"].dropna()}) if "n" in df else []
    name = meta.display.replace("@n", f"@{ns[0]}") if len(ns) == 1 else meta.display
    for ax, bench in zip(axes, benches):
        band = seed_band(df[df["benchmark"] == bench], metric)
        _draw(ax, band, colors, meta.scale, marker="o")
        ax.set_title(benchmark_display(bench))
        ax.set_xlabel("Step")
        ax.set_ylabel(meta.axis_label().replace(meta.display, name))
        ax.grid(alpha=0.3)
    fig.suptitle(f"Evaluation accuracy ({scorer} scorer); {BAND}")
    legend(fig, axes)
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
        _draw(ax, seed_band(train_df, metric, smooth), colors, meta.scale, marker="")
        ax.set_title(meta.display)
        ax.set_xlabel("Step")
        ax.set_ylabel(meta.axis_label())
        ax.grid(alpha=0.3)
    title = "Training dynamics" + (f" (rolling mean over {smooth} steps)" if smooth > 1 else "")
    fig.suptitle(f"{title}; {BAND}")
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
