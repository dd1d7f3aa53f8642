"""The report's first paragraph: which methods the sweep separates from the baseline, in words.

Computed from a Last/Best table (`analysis.tables.last_best_table`, one scorer), never
written by hand. Per benchmark, a method is *better* (or *worse*) than the baseline when the
95% paired bootstrap interval of its Δ excludes 0, and *not distinguishable* when it
contains 0. The verdict reads the Last statistic (the final evaluated checkpoint): Best is a
maximum over checkpoints chosen after the fact, biased upwards by evaluation noise, so it is
shown in the tables but not judged. The warm start (the initial model, before any RL step)
gives each method's gain: its Last mean minus the initial model's score. Each benchmark
also gets the smallest difference its design could have detected (`analysis.power`), so a
"not distinguishable" reads against what the sweep could have seen.

    from analysis.verdict import verdict_paragraph
    text = verdict_paragraph(tidy, initial_means={"toy": 0.3125})
"""

from __future__ import annotations

import math

import pandas as pd

from analysis.contrasts import CONTRAST_NAMES, separates
from analysis.stats import PairedDelta
from analysis.tables import (
    benchmark_display,
    benchmark_order,
    format_delta,
    label_order,
    metric_name,
    signed,
)
from common.metrics import metric_meta

VERDICT_STAT = "last"


def _delta_text(r, meta) -> str:
    return f"{r.label} ({format_delta(r.delta, r.delta_low, r.delta_high, meta)})"


def _join(items: list[str]) -> str:
    return ", ".join(items)


def benchmark_sentence(rows: pd.DataFrame, bench: str, baseline: str) -> str:
    """One benchmark's sentence from its Last rows (every label, the baseline included)."""
    meta = metric_meta(str(rows["metric"].iloc[0]))
    name = benchmark_display(bench)
    if baseline not in set(rows["label"]):
        return f"On {name}, {baseline} was not evaluated, so no method is compared with it."
    groups: dict[str, list[str]] = {"better": [], "worse": [], "tie": [], "none": []}
    others = rows[rows["label"] != baseline]
    order = {lab: i for i, lab in enumerate(label_order(others["label"]))}
    for r in sorted(others.itertuples(), key=lambda r: order[r.label]):
        if math.isnan(r.delta):
            groups["none"].append(r.label)
            continue
        kind = PairedDelta(r.delta, r.delta_low, r.delta_high, r.delta_pairs).verdict
        groups[kind].append(_delta_text(r, meta))
    parts = []
    if groups["better"]:
        parts.append(f"better than {baseline}: {_join(groups['better'])}")
    if groups["worse"]:
        parts.append(f"worse than {baseline}: {_join(groups['worse'])}")
    if groups["tie"]:
        lead = "no method is" if not (groups["better"] or groups["worse"]) else "not"
        parts.append(f"{lead} distinguishable from {baseline} at 95%: {_join(groups['tie'])}")
    if groups["none"]:
        parts.append(f"no paired per-problem records: {_join(groups['none'])}")
    if not parts:
        return f"On {name}, {baseline} is the only method."
    return f"On {name}, " + "; ".join(parts) + "."


def gain_sentence(rows: pd.DataFrame, bench: str, initial: float) -> str:
    """The warm start's score on `bench` and every method's Last gain over it."""
    meta = metric_meta(str(rows["metric"].iloc[0]))
    order = {lab: i for i, lab in enumerate(label_order(rows["label"]))}
    gains = [
        f"{r.label} {signed(r.mean - initial, meta)}"
        for r in sorted(rows.itertuples(), key=lambda r: order[r.label])
    ]
    return (
        f"The warm start (the initial model, before any RL step) scores "
        f"{meta.format(initial)} on {benchmark_display(bench)}; gain at Last over it: "
        f"{_join(gains)}."
    )


def detectable_sentence(bench: str, span: tuple[float, float], meta) -> str:
    """The smallest Δ this design could have detected on `bench` (analysis.power's MDD)."""
    lo, hi = span
    if math.isnan(lo):
        return (f"On {benchmark_display(bench)} the smallest detectable difference cannot be "
                "estimated: every sample scored the same on both sides.")
    size = meta.format(lo) if math.isclose(lo, hi) else f"{meta.format(lo)}-{meta.format(hi)}"
    return (f"The smallest difference this design could have detected on "
            f"{benchmark_display(bench)} (95% interval, 80% power; `python -m analysis power`) "
            f"is {size}.")


def verdict_paragraph(tidy: pd.DataFrame, initial_means: dict[str, float] | None = None,
                      detectable: dict[str, tuple[float, float]] | None = None) -> str:
    """The verdict (see module doc) for one scorer's tidy Last/Best table; `initial_means`
    maps benchmark -> the initial model's Mean@n (fraction), absent when not evaluated;
    `detectable` maps benchmark -> (smallest, largest) minimum detectable Δ over methods."""
    last = tidy[tidy["stat"] == VERDICT_STAT]
    baseline = str(tidy["baseline"].iloc[0])
    meta = metric_meta(str(tidy["metric"].iloc[0]))
    unit = " (percentage points)" if meta.fmt == "percent" else ""
    seeds = sorted(set(last["n_seeds"]))
    seeds_txt = str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
    sentences = [
        f"**Verdict** (computed from the tables below: scorer `{tidy['scorer'].iloc[0]}`, "
        f"{metric_name(tidy)} at Last, {seeds_txt} seed(s) per method; Δ = method - {baseline}"
        f"{unit} with its 95% paired bootstrap interval over (problem, seed) pairs; an "
        "interval that excludes 0 separates a method from the baseline)."
    ]
    for bench in benchmark_order(last["benchmark"]):
        rows = last[last["benchmark"] == bench]
        sentences.append(benchmark_sentence(rows, bench, baseline))
        if detectable and bench in detectable:
            sentences.append(detectable_sentence(bench, detectable[bench], meta))
        if initial_means and bench in initial_means:
            sentences.append(gain_sentence(rows, bench, initial_means[bench]))
    return " ".join(sentences)


def _separation(delta: float, low: float, high: float, detectable: float, fmt) -> str:
    """"+1.20 [-2.10, +4.50] (not separated; detectable 4.80)" in `fmt`'s units."""
    if math.isnan(delta):
        return "n/a (no paired runs)"
    if math.isnan(low):
        return f"{fmt(delta, True)} (one seed: no interval)"
    said = "separated" if separates(low, high) else "not separated"
    size = "" if math.isnan(detectable) else f"; detectable {fmt(detectable, False)}"
    return f"{fmt(delta, True)} [{fmt(low, True)}, {fmt(high, True)}] ({said}{size})"


def _points(x: float, sign: bool) -> str:
    return f"{100 * x:+.2f}" if sign else f"{100 * x:.2f}"


def _nats(x: float, sign: bool) -> str:
    return f"{x:+.3f}" if sign else f"{x:.3f}"


def contrast_paragraph(rows: pd.DataFrame) -> str:
    """The overlay's contrasts in words (`analysis.contrasts.contrast_rows` output): for each
    pair, accuracy Δ and KL Δ at Last with their 95% intervals, whether each separates, and
    the smallest difference the design could have detected. "" when there is no pair."""
    if rows.empty:
        return ""
    seeds = sorted(set(int(s) for s in rows["seeds"]))
    seeds_txt = str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
    bench = benchmark_display(str(rows["benchmark"].iloc[0]))
    sentences = [
        f"**Contrasts** (computed: at Last on {bench}, {seeds_txt} seed(s) per cell; accuracy "
        "Δ = cell - partner in percentage points with its 95% paired bootstrap interval over "
        "(problem, seed) pairs; KL Δ = the difference of KL(pi_ckpt || pi_init) in nats per "
        "response with its 95% t interval over seeds; separated = the interval excludes 0; "
        "detectable = the smallest Δ this design detects at 95% with 80% power)."]
    for contrast, group in rows.groupby("contrast", sort=False):
        parts = [f"{r.label} vs {r.partner}: accuracy "
                 f"{_separation(r.delta, r.delta_low, r.delta_high, r.mdd, _points)}, KL "
                 f"{_separation(r.kl_delta, r.kl_low, r.kl_high, r.kl_mdd, _nats)}"
                 for r in group.itertuples()]
        sentences.append(f"{CONTRAST_NAMES[contrast][0].upper()}"
                         f"{CONTRAST_NAMES[contrast][1:]}: {'; '.join(parts)}.")
    return " ".join(sentences)
