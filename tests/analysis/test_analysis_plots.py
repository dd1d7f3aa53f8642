"""Curves: files written, seed bands by hand, one color per method across figures."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from analysis_fixtures import summary
from matplotlib.collections import PolyCollection

from analysis.collect import collect, collect_initial
from analysis.plots import method_colors, plot_accuracy, plot_training, seed_band, write_plots


def _col(sweep):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return collect(sweep)


def test_seed_band_by_hand(sweep):
    ev = _col(sweep).eval
    d = ev[(ev.scorer == "dapo") & (ev.benchmark == "aime24")]
    band = seed_band(d, "mean").set_index(["label", "step"])
    # RPG-URKL @20: seeds 0.40, 0.60 -> mean 0.50, se 0.10, k=2
    r = band.loc[("RPG-URKL", 20)]
    assert (r["mean"], r.se, r.k) == (pytest.approx(0.5), pytest.approx(0.1), 2)
    assert band.loc[("GRPO", 20), "k"] == 1
    assert math.isnan(band.loc[("GRPO", 20), "se"])  # one seed: no error band


def test_smoothing_is_a_trailing_mean_per_run(sweep):
    train = _col(sweep).train
    band = seed_band(train[train.run_id == "grpo_s0"], "reward_mean", smooth=2)
    # reward_mean = 0.1 * step: steps 1,2,3 -> 0.1, 0.15, 0.25
    assert list(band["mean"]) == pytest.approx([0.1, 0.15, 0.25])


def test_files_are_png_and_pdf(sweep, tmp_path):
    col = _col(sweep)
    files = write_plots(col.train, col.eval, tmp_path / "plots")
    assert set(files) == {"accuracy_dapo", "accuracy_math_verify", "training"}
    for png, pdf in files.values():
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
        assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 2000


def test_no_evals_means_no_accuracy_figure(sweep, tmp_path):
    col = _col(sweep)
    files = write_plots(col.train, col.eval.iloc[0:0], tmp_path / "plots")
    assert set(files) == {"training"}


def _line_colors(fig) -> dict[str, tuple]:
    out = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            out.setdefault(line.get_label(), set()).add(tuple(line.get_color()))
    return out


def test_one_color_per_method_across_figures(sweep):
    col = _col(sweep)
    colors = method_colors(set(col.train.label) | set(col.eval.label))
    acc = _line_colors(plot_accuracy(col.eval, "dapo", colors))
    train_fig = plot_training(col.train, colors)
    train = _line_colors(train_fig)
    # the fixture's one-seed runs log the same training curves: drawn once, every label named
    first = {entry: entry.removesuffix(" (identical)").split(" = ") for entry in train}
    assert {lab for labs in first.values() for lab in labs} == {"DAPO", "GRPO", "RPG-URKL",
                                                                "REINFORCE++"}
    for label, seen in acc.items():
        assert seen == {colors[label]}
    for entry, seen in train.items():
        assert seen == {colors[first[entry][0]]}
    assert len(set(colors.values())) == len(colors)
    # shaded band only where two seeds exist: RPG-URKL, in each accuracy panel
    fig = plot_accuracy(col.eval, "dapo", colors)
    bands = [c for c in fig.axes[0].collections if isinstance(c, PolyCollection)]
    assert len(bands) == 1
    assert fig.axes[0].get_ylabel() == "Mean@4 (%)"
    assert [ax.get_title() for ax in fig.axes] == ["AIME24", "AMC23"]


def test_missing_training_metric_is_named(sweep):
    col = _col(sweep)
    with pytest.raises(ValueError, match="kl_ref_k3"):
        plot_training(col.train, method_colors(col.train.label), ("entropy", "kl_ref_k3"))


def test_accuracy_figure_draws_a_seed_band_per_multi_seed_method(sweep):
    """RPG-URKL (2 seeds) on AIME24: 0.50, 0.30 at step 10 and 0.40, 0.60 at step 20, so
    mean 40 / 50, se 10 / 10 (percent): the band spans 30-50 and 40-60; one-seed methods get
    a line and no band."""
    col = _col(sweep)
    colors = method_colors(set(col.eval.label))
    fig = plot_accuracy(col.eval, "dapo", colors)
    ax = fig.axes[0]
    assert ax.get_title() == "AIME24"
    assert "band: ± 1 standard error" in fig.get_suptitle()
    bands = ax.collections
    assert len(bands) == 1 and tuple(bands[0].get_facecolor()[0][:3]) == colors["RPG-URKL"][:3]
    ys = sorted({round(float(y), 6) for _, y in bands[0].get_paths()[0].vertices})
    assert ys == [30.0, 40.0, 50.0, 60.0]


def test_accuracy_curves_start_at_step_0_from_the_initial_model(sweep):
    """Every method starts from the initial model, so its AIME24 line begins at step 0 with
    the initial model's Mean@n (0.125 -> 12.5 %), then the run's own steps 10, 20; AMC23,
    which the initial model was not evaluated on, keeps starting at step 10."""
    d = sweep / "initial" / "eval" / "step_0"
    d.mkdir(parents=True)
    (d / "aime24.json").write_text(json.dumps(summary("aime24", 0, 0.125)))
    col = _col(sweep)
    fig = plot_accuracy(col.eval, "dapo", method_colors(set(col.eval.label)),
                        initial=collect_initial(sweep))
    aime, amc = fig.axes
    for line in aime.get_lines():
        x, y = line.get_data()
        assert list(x[:1]) == [0] and y[0] == pytest.approx(12.5) and list(x[1:3]) == [10, 20]
    assert all(line.get_data()[0][0] == 10 for line in amc.get_lines())
    assert len(aime.get_lines()) == col.eval.loc[col.eval.benchmark == "aime24", "label"].nunique()


def _curves(means: dict[str, dict[str, list[float]]]):
    """eval rows: {label: {bench: [mean at step 10, 20, 30]}}, one seed each."""
    rows = [{"run_id": f"{label}_s0", "label": label, "seed": 0, "step": 10 * (i + 1),
             "benchmark": bench, "scorer": "dapo", "mean": v, "n": 4}
            for label, by_bench in means.items() for bench, values in by_bench.items()
            for i, v in enumerate(values)]
    return pd.DataFrame(rows)


def test_a_point_without_a_neighbouring_band_gets_an_error_bar():
    """Evaluated at the last step only, after the initial model's point: a band between
    steps 0 (one value, no se) and 8 has nothing to span, so step 8 gets a bar of ± 1 se
    (seeds 40 and 60: mean 50, se 10); points inside a band get none."""
    from matplotlib.container import ErrorbarContainer

    from analysis.plots import isolated

    rows = [{"run_id": f"DAPO_s{s}", "label": "DAPO", "seed": s, "step": step,
             "benchmark": "toy", "scorer": "dapo", "mean": v, "n": 4}
            for s, (a, b) in enumerate([(0.1, 0.4), (0.1, 0.6)]) for step, v in ((0, a), (8, b))]
    rows = [r for r in rows if r["step"] == 8 or r["seed"] == 0]  # step 0: one value
    fig = plot_accuracy(pd.DataFrame(rows), "dapo", method_colors(["DAPO"]))
    (ax,) = fig.axes
    (bar,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    (segment,) = bar.lines[2][0].get_segments()
    assert segment.ravel().tolist() == pytest.approx([8.0, 40.0, 8.0, 60.0], abs=1e-9)
    assert "band (bar at a lone point): ± 1 standard error" in fig.get_suptitle()
    # two methods' bars at one step stand apart, either side of it (1.5% of 0-8 each way)
    two = pd.DataFrame(rows + [{**r, "label": "GRPO", "run_id": r["run_id"] + "g",
                                "mean": r["mean"] + 0.05} for r in rows])
    ax2 = plot_accuracy(two, "dapo", method_colors(["DAPO", "GRPO"])).axes[0]
    xs = sorted(c.lines[2][0].get_segments()[0][0][0] for c in ax2.containers
                if isinstance(c, ErrorbarContainer))
    assert xs == pytest.approx([8 - 0.06, 8 + 0.06])
    nan = float("nan")
    assert isolated(np.array([nan, 1.0])).tolist() == [False, True]
    assert isolated(np.array([nan, 1.0, 1.0, nan, 2.0])).tolist() == [False] * 4 + [True]
    assert not isolated(np.array([nan, nan])).any()


def test_a_benchmark_with_one_value_everywhere_gets_a_note_not_a_panel():
    ev = _curves({"DAPO": {"aime24": [0, 0, 0], "toy": [0.2, 0.3, 0.25]},
                  "GRPO": {"aime24": [0, 0, 0], "toy": [0.2, 0.25, 0.3]}})
    fig = plot_accuracy(ev, "dapo", method_colors(["DAPO", "GRPO"]))
    assert [ax.get_title() for ax in fig.axes] == ["Toy"]
    assert fig.legends[0].get_title().get_text() == "AIME24 is not drawn: every value is 0.00."
    for ax in fig.axes:  # no panel of the figure is flat
        ys = np.concatenate([line.get_ydata() for line in ax.get_lines()])
        assert len(np.unique(ys)) > 1
    # a sweep with that benchmark alone still draws it (there is nothing else to show)
    only = plot_accuracy(ev[ev.benchmark == "aime24"], "dapo", method_colors(["DAPO", "GRPO"]))
    assert [ax.get_title() for ax in only.axes] == ["AIME24"]
    # ... and so does one whose every benchmark is flat (a scorer no answer passes)
    flat = _curves({"DAPO": {"aime24": [0, 0, 0], "toy": [0, 0, 0]}})
    drawn = plot_accuracy(flat, "dapo", method_colors(["DAPO"]))
    assert [ax.get_title() for ax in drawn.axes] == ["AIME24", "Toy"]


def test_identical_curves_are_drawn_once_and_near_ones_apart():
    ev = _curves({"A": {"toy": [0.2, 0.3, 0.25]}, "B": {"toy": [0.2, 0.3, 0.25]},
                  "C": {"toy": [0.2, 0.3, 0.251]}, "D": {"toy": [0.1, 0.2, 0.3]}})
    colors = method_colors(["A", "B", "C", "D"])
    (ax,) = plot_accuracy(ev, "dapo", colors).axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"A = B (identical)", "C", "D"}
    # C nearly coincides with A and B: its own marker and dash pattern tell it apart
    a, c = lines["A = B (identical)"], lines["C"]
    assert a.get_marker() != c.get_marker() and a.get_linestyle() != c.get_linestyle()
    assert tuple(a.get_color()) == colors["A"]


def test_frontier_designs_mark_beta_by_shape_and_print_no_labels():
    from analysis.frontier import plot_designs

    pts = pd.DataFrame([{"method": m, "beta": b, "beta_text": str(b), "benchmark": "toy",
                         "acc": 0.2 + 0.01 * i, "acc_low": 0.15, "acc_high": 0.3,
                         "kl": 1.0 + 0.001 * i, "kl_low": 0.9, "kl_high": 1.1, "k": 3}
                        for i, (m, b) in enumerate((m, b) for m in ("GRPO", "RPG")
                                                   for b in (0.001, 0.01, 1.0))])
    fig = plot_designs(pts, method_colors(["GRPO", "RPG"]), "dapo")
    (ax,) = fig.axes
    assert len(ax.texts) == 0  # nothing to overprint where designs crowd
    markers = {line.get_marker() for line in ax.get_lines()
               if line.get_linestyle() == "None" and line.get_marker() not in ("_", "|")}
    assert len(markers) == 3  # one shape per beta (the error bars' caps aside)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["GRPO", "RPG", "β = 0.001", "β = 0.01", "β = 1.0"]


@pytest.mark.parametrize("snapshot", sorted(
    p.name for p in (Path(__file__).resolve().parents[2] / "docs" / "runs").iterdir()))
def test_no_shipped_snapshot_figure_has_a_flat_panel(snapshot):
    """The figures of every docs/runs snapshot, redrawn from its tables for each scorer
    it graded with: each panel's accuracy varies (AIME24 at 0 everywhere is a note, not a
    panel). A scorer no answer ever passes (every value the same) is left out: its figure
    has nothing but flat panels to draw (`constant_benchmarks`)."""
    from analysis.frontier import checkpoint_points, design_points, plot_designs, plot_frontier

    tables = Path(__file__).resolve().parents[2] / "docs" / "runs" / snapshot / "tables"
    ev = pd.read_csv(tables / "eval_metrics.csv")
    for col in [c for c in ev.columns if c.startswith("tag_")]:
        ev[col] = ev[col].fillna("").astype(str)
    colors = method_colors(ev["label"])
    scorers = [s for s, rows in ev.groupby("scorer") if rows["mean"].nunique() > 1]
    assert scorers, snapshot
    for scorer in scorers:
        figs = [plot_accuracy(ev, scorer, colors)]
        points = checkpoint_points(ev, scorer)
        if not points.empty:
            figs.append(plot_frontier(points, colors, scorer))
        designs = design_points(ev, scorer)
        if not designs.empty:
            figs.append(plot_designs(designs, method_colors(designs["method"]), scorer))
        for fig in figs:
            for ax in fig.axes:
                ys = np.concatenate([line.get_ydata() for line in ax.get_lines()])
                assert len(np.unique(ys)) > 1, (snapshot, scorer, ax.get_title())


def test_a_long_legend_sits_under_the_panels_without_overlapping_them():
    """The frontier's 16 designs: the figure grows by each legend row, so the legend lies
    below every panel (x label included) and the title above every panel's title."""
    labels = [f"{m} [beta{b} ref-fixed]" for m in ("GRPO", "GRPO-ISKL", "RPG-URKL",
                                                   "RPG-REINFORCE-URKL")
              for b in ("1e-3", "0.01", "0.1", "1")]
    ev = _curves({lab: {"toy": [0.2 + 0.01 * i, 0.25, 0.3 - 0.01 * i]}
                  for i, lab in enumerate(labels)})
    fig = plot_accuracy(ev, "dapo", method_colors(labels))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend_box = fig.legends[0].get_window_extent(renderer)
    for ax in fig.axes:
        panel = ax.get_tightbbox(renderer)
        assert legend_box.y1 <= panel.y0 + 1, (legend_box, panel)
        assert fig._suptitle.get_window_extent(renderer).y0 >= ax.title.get_window_extent(
            renderer).y1 - 1


def test_steps_on_another_problem_set_are_hollow_and_named():
    """real-cpu's design: steps 4-12 evaluate the first 40 questions, Last (16) and the warm
    start all 100. The 40-question points are drawn again hollow, and the note under the
    figure names the steps and both counts; a panel on one problem set gets neither."""
    rows = [{"run_id": f"{label}_s0", "label": label, "seed": 0, "step": step,
             "benchmark": "arithmetic", "scorer": "dapo", "mean": 0.3 + 0.01 * step + shift,
             "n": 4, "num_problems": 100 if step == 16 else 40}
            for label, shift in (("DAPO", 0.0), ("GRPO", 0.05)) for step in (4, 8, 12, 16)]
    initial = pd.DataFrame([{"step": 0, "benchmark": "arithmetic", "scorer": "dapo",
                             "mean": 0.36, "n": 4, "num_problems": 100}])
    colors = method_colors(["DAPO", "GRPO"])
    fig = plot_accuracy(pd.DataFrame(rows), "dapo", colors, initial=initial)
    (ax,) = fig.axes
    hollow = [line for line in ax.get_lines() if line.get_markerfacecolor() == "white"]
    assert len(hollow) == 2
    for line in hollow:
        assert list(line.get_xdata()) == [4, 8, 12]
    assert {tuple(line.get_markeredgecolor()) for line in hollow} == {colors["DAPO"],
                                                                       colors["GRPO"]}
    note = fig.legends[0].get_title().get_text()
    assert note == ("Arithmetic: hollow points (steps 4, 8, 12) are 40 problems, filled ones "
                    "Last's 100: the line joins two problem sets")
    same = pd.DataFrame([{**r, "num_problems": 100} for r in rows])
    fig = plot_accuracy(same, "dapo", colors, initial=initial)
    assert not [line for line in fig.axes[0].get_lines()
                if line.get_markerfacecolor() == "white"]
    assert fig.legends[0].get_title().get_text() == ""
