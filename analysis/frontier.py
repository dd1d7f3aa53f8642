"""The reward-KL frontier: evaluation accuracy against the KL to the initial model.

- `frontier_<scorer>.{png,pdf}`: one panel per benchmark; x = KL(pi_ckpt || pi_init) that
  each checkpoint paid (eval/kl.py, the k1 estimate in nats per response), y = Mean@n. One
  curve per method (run label) through its checkpoints in step order, starting at the
  initial model (KL 0 by definition, its step-0 accuracy) when it was evaluated; at each
  checkpoint the mean over seeds, the band ± one standard error of the accuracy over seeds
  and the horizontal bar ± one standard error of the KL over seeds.
- `frontier_designs_<scorer>.{png,pdf}`: only for a sweep that varies beta (e.g.
  config/ablations/frontier.yaml): one point per design (method x beta) at its Last
  checkpoint, 95% t intervals over seeds on both axes, one curve per method (its color)
  through its betas in order, each beta its own marker shape (a legend, not text labels
  that would overprint where designs crowd).

As in analysis.plots, a benchmark whose accuracy is the same in every point gets no panel,
only a note under the figure, and curves that coincide exactly are drawn once.

Where the evaluations carry no KL (older summaries, top_p < 1) no frontier is drawn.
Run: part of `python -m analysis report ...`; `write_frontier_plots(eval_df, out_dir, ...)`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.plots import (
    MARKERS,
    coinciding,
    constant_benchmarks,
    curve_label,
    footnote,
    legend,
    method_colors,
    panels,
    save_figure,
)
from analysis.stats import seed_interval
from analysis.tables import KL_METRIC, benchmark_display, label_order
from common.metrics import metric_meta

ACCURACY = "mean"


def _has_kl(df: pd.DataFrame) -> bool:
    return KL_METRIC in df and df[KL_METRIC].notna().any()


def checkpoint_points(eval_df: pd.DataFrame, scorer: str,
                      initial: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (label, benchmark, step): acc, acc_se, kl, kl_se over seeds and k (seeds); step 0
    is the initial model (kl 0) when `initial` holds its accuracy and the label has no step
    0 of its own. Checkpoints without a KL are left out."""
    df = eval_df[(eval_df["scorer"] == scorer)].dropna(subset=[KL_METRIC, ACCURACY])
    rows = []
    for (label, bench, step), g in df.groupby(["label", "benchmark", "step"]):
        acc = seed_interval(g[ACCURACY].to_numpy(dtype=float))
        kl = seed_interval(g[KL_METRIC].to_numpy(dtype=float))
        rows.append({"label": label, "benchmark": bench, "step": int(step), "acc": acc.mean,
                     "acc_se": acc.se, "kl": kl.mean, "kl_se": kl.se, "k": acc.k})
    points = pd.DataFrame(rows, columns=["label", "benchmark", "step", "acc", "acc_se", "kl",
                                         "kl_se", "k"])
    if initial is not None and not initial.empty and not points.empty:
        start = initial[initial["scorer"] == scorer].dropna(subset=[ACCURACY])
        extra = []
        for (label, bench), g in points.groupby(["label", "benchmark"]):
            value = start.loc[start["benchmark"] == bench, ACCURACY]
            if not value.empty and 0 not in set(g["step"]):
                extra.append({"label": label, "benchmark": bench, "step": 0,
                              "acc": float(value.iloc[0]), "acc_se": math.nan, "kl": 0.0,
                              "kl_se": math.nan, "k": 1})
        if extra:
            points = pd.concat([pd.DataFrame(extra), points], ignore_index=True)
    return points.sort_values(["label", "benchmark", "step"]).reset_index(drop=True)


def design_points(eval_df: pd.DataFrame, scorer: str) -> pd.DataFrame:
    """Per (method, beta, benchmark) at each run's Last checkpoint: acc and kl with their
    95% t intervals over seeds, clipped to each quantity's range (acc_low/high, kl_low/high;
    NaN with one seed). Needs the
    runs' tag_method and tag_beta; empty unless some method has two or more betas."""
    need = {"tag_method", "tag_beta", KL_METRIC}
    if not need <= set(eval_df.columns):
        return pd.DataFrame()
    df = eval_df[eval_df["scorer"] == scorer].dropna(subset=[KL_METRIC, ACCURACY])
    df = df[df["tag_beta"].astype(str).str.len() > 0]
    if df.empty:
        return pd.DataFrame()
    last = df.loc[df.groupby(["run_id", "benchmark"])["step"].idxmax()]
    rows = []
    acc_range, kl_range = metric_meta(ACCURACY).value_range, metric_meta(KL_METRIC).value_range
    for (method, beta, bench), g in last.groupby(["tag_method", "tag_beta", "benchmark"]):
        acc = seed_interval(g[ACCURACY].to_numpy(dtype=float), bounds=acc_range)
        kl = seed_interval(g[KL_METRIC].to_numpy(dtype=float), bounds=kl_range)
        rows.append({"method": method, "beta": float(beta), "beta_text": str(beta),
                     "benchmark": bench, "acc": acc.mean, "acc_low": acc.low,
                     "acc_high": acc.high, "kl": kl.mean, "kl_low": kl.low,
                     "kl_high": kl.high, "k": acc.k})
    points = pd.DataFrame(rows)
    if points.empty or points.groupby(["method", "benchmark"])["beta"].nunique().max() < 2:
        return pd.DataFrame()
    return points.sort_values(["method", "benchmark", "beta"]).reset_index(drop=True)


def _axes_labels(ax, bench: str) -> None:
    acc, kl = metric_meta(ACCURACY), metric_meta(KL_METRIC)
    ax.set_title(benchmark_display(bench))
    ax.set_xlabel(f"{kl.display}, nats per response")
    ax.set_ylabel(acc.axis_label())
    ax.grid(alpha=0.3)


def _panel_curves(points: pd.DataFrame, key: str):
    """A figure with one panel per benchmark whose accuracy varies and the curves to draw on
    them: (fig, axes, iterator of (ax, group of `key` values drawn as one, rows, kl,
    accuracy in display units), note on the benchmarks left out); each panel gets its title
    and axis labels once its curves are drawn."""
    meta = metric_meta(ACCURACY)
    benches, note = constant_benchmarks(points.rename(columns={"acc": ACCURACY}), ACCURACY, meta)
    fig, axes = panels(len(benches))

    def curves():
        for ax, bench in zip(axes, benches):
            b = points[points["benchmark"] == bench]
            drawn = {name: (b.loc[b[key] == name, "kl"].to_numpy(),
                            b.loc[b[key] == name, "acc"].to_numpy() * meta.scale)
                     for name in label_order(b[key])}
            for group in coinciding(drawn):
                x, y = drawn[group[0]]
                yield ax, group, b[b[key] == group[0]], x, y
            _axes_labels(ax, bench)

    return fig, axes, curves(), note


def plot_frontier(points: pd.DataFrame, colors: dict[str, tuple], scorer: str):
    """Accuracy against KL per benchmark, one curve per label through its checkpoints."""
    scale = metric_meta(ACCURACY).scale
    fig, axes, curves, note = _panel_curves(points, "label")
    for ax, group, p, x, y in curves:
        color = colors[group[0]]
        se, xse = p["acc_se"].to_numpy() * scale, p["kl_se"].to_numpy()
        ax.plot(x, y, color=color, label=curve_label(group), marker="o", markersize=3, lw=1.4)
        if np.isfinite(se).any():
            ax.fill_between(x, y - np.nan_to_num(se), y + np.nan_to_num(se),
                            color=color, alpha=0.2, lw=0)
        if np.isfinite(xse).any():
            ax.errorbar(x, y, xerr=np.nan_to_num(xse), fmt="none", ecolor=color,
                        alpha=0.6, lw=0.8)
    fig.suptitle(f"Accuracy vs KL to the initial model ({scorer} scorer)\ncurve through "
                 "checkpoints; mean over seeds, band and bars ± 1 s.e.", fontsize="medium")
    legend(fig, axes)
    footnote(fig, note)
    return fig


def beta_markers(betas) -> dict[str, str]:
    """beta text -> marker shape, in increasing beta."""
    ordered = sorted(set(betas), key=float)
    return {b: MARKERS[i % len(MARKERS)] for i, b in enumerate(ordered)}


def plot_designs(points: pd.DataFrame, colors: dict[str, tuple], scorer: str):
    """Accuracy against KL at the Last checkpoint per design, a curve per method through
    its betas, each beta its marker, 95% intervals over seeds on both axes."""
    from matplotlib.lines import Line2D

    scale = metric_meta(ACCURACY).scale
    shapes = beta_markers(points["beta_text"])
    fig, axes, curves, note = _panel_curves(points, "method")
    for ax, group, p, x, y in curves:
        color = colors[group[0]]
        yerr = np.nan_to_num(np.abs(np.vstack([p["acc_low"], p["acc_high"]]) * scale - y))
        xerr = np.nan_to_num(np.abs(np.vstack([p["kl_low"], p["kl_high"]]) - x))
        ax.errorbar(x, y, xerr=xerr, yerr=yerr, color=color, fmt="none", lw=1.0, capsize=2,
                    alpha=0.7)
        ax.plot(x, y, color=color, label=curve_label(group), lw=1.4)
        for xi, yi, beta in zip(x, y, p["beta_text"]):
            ax.plot([xi], [yi], ls="", marker=shapes[beta], markersize=6, color=color,
                    markeredgecolor="black", markeredgewidth=0.5)
    fig.suptitle(f"Frontier per design at the Last checkpoint ({scorer} scorer)\nmean over "
                 "seeds, bars: 95% t interval over seeds; color: method, marker: beta",
                 fontsize="medium")
    legend(fig, axes, extra=[(Line2D([], [], ls="", marker=m, color="grey",
                                     markeredgecolor="black", markeredgewidth=0.5),
                              f"β = {b}") for b, m in shapes.items()])
    footnote(fig, note)
    return fig


def write_frontier_plots(eval_df: pd.DataFrame, out_dir: str | Path,
                         colors: dict[str, tuple], initial: pd.DataFrame | None = None
                         ) -> dict[str, list[Path]]:
    """`frontier_<scorer>` (and `frontier_designs_<scorer>` for a beta grid) into
    `out_dir`; {} when no evaluation carries a KL."""
    written: dict[str, list[Path]] = {}
    if eval_df.empty or not _has_kl(eval_df):
        return written
    for scorer in sorted(eval_df["scorer"].unique()):
        points = checkpoint_points(eval_df, scorer, initial)
        if points.empty:
            continue
        fig = plot_frontier(points, colors, scorer)
        written[f"frontier_{scorer}"] = save_figure(fig, Path(out_dir) / f"frontier_{scorer}")
        designs = design_points(eval_df, scorer)
        if not designs.empty:
            fig = plot_designs(designs, method_colors(designs["method"]), scorer)
            stem = Path(out_dir) / f"frontier_designs_{scorer}"
            written[f"frontier_designs_{scorer}"] = save_figure(fig, stem)
    return written
