"""The report's first paragraph: which methods the sweep separates from the baseline, in words.

Computed from a Last/Best table (`analysis.tables.last_best_table`, one scorer), never
written by hand. Δ is paired by seed with the training run as the unit (`analysis.delta`).
The paragraph says how many comparisons it makes (K, the Last Δs that vary) and reads each
through Holm's adjustment over those K: a method is *better* (or *worse*) than the baseline,
a finding, when its 95% interval excludes 0 and its Holm-adjusted p is below 0.05; an
interval that excludes 0 without surviving Holm is said to separate *unadjusted only*; an
interval that contains 0 is *not distinguishable*. The verdict reads the Last statistic
(the final evaluated checkpoint): Best is a maximum over checkpoints chosen after the fact,
biased upwards by evaluation noise, so it is shown in the tables but not judged. The warm
start (the initial model, before any RL step) gives each method's gain: its Last mean and
seed interval minus the initial model's score (one evaluation, taken as fixed: its own
sampling error is not in the interval). Each benchmark
also gets the smallest difference its design could have detected (`analysis.power`), so a
"not distinguishable" reads against what the sweep could have seen.

    from analysis.verdict import verdict_paragraph
    text = verdict_paragraph(tidy, initial_means={"toy": 0.3125})
"""

from __future__ import annotations

import math

import pandas as pd

from analysis.contrasts import CONTRAST_NAMES, separates
from analysis.delta import family_size, row_state
from analysis.power import Detectable
from analysis.stats import CONSTANT_SD, delta_state
from analysis.tables import (
    benchmark_display,
    benchmark_order,
    format_delta,
    format_p,
    label_order,
    metric_name,
    signed,
)
from common.metrics import metric_meta

VERDICT_STAT = "last"
ALPHA = 0.05  # a finding: Holm-adjusted p below this (the 95% intervals' level)


def _delta_text(r, meta) -> str:
    return f"{r.label} ({format_delta(r.delta, r.delta_low, r.delta_high, meta, r.delta_p_holm)})"


def _untestable(r, meta, state: str) -> str:
    """An untested Δ in the verdict's words: the label, with its Δ where there is one."""
    if state == "constant":
        return f"{r.label} ({signed(r.delta, meta)} in each of {int(r.delta_seeds)} seeds)"
    return _delta_text(r, meta) if state == "one seed" else r.label


def reading(low: float, high: float, p_holm: float) -> str:
    """How one Δ reads: "finding" (interval excludes 0 and Holm p < ALPHA), "unadjusted"
    (excludes 0, does not survive Holm), "tie" (contains 0), "untested" (no interval)."""
    if math.isnan(low) or math.isnan(high):
        return "untested"
    if not separates(low, high):
        return "tie"
    return "finding" if p_holm < ALPHA else "unadjusted"


def _join(items: list[str]) -> str:
    return ", ".join(items)


def benchmark_sentence(rows: pd.DataFrame, bench: str, baseline: str) -> str:
    """One benchmark's sentence from its Last rows (every label, the baseline included)."""
    meta = metric_meta(str(rows["metric"].iloc[0]))
    name = benchmark_display(bench)
    if baseline not in set(rows["label"]):
        return f"On {name}, {baseline} was not evaluated, so no method is compared with it."
    groups: dict[str, list[str]] = {k: [] for k in (
        "better", "worse", "better_unadjusted", "worse_unadjusted", "tie", "one_seed",
        "constant", "nothing", "none")}
    others = rows[rows["label"] != baseline]
    order = {lab: i for i, lab in enumerate(label_order(others["label"]))}
    for r in sorted(others.itertuples(), key=lambda r: order[r.label]):
        if math.isnan(r.delta):
            groups["none"].append(r.label)
            continue
        kind = reading(r.delta_low, r.delta_high, r.delta_p_holm)
        if kind == "untested":
            state = row_state(r)
            key = {"one seed": "one_seed", "constant": "constant"}.get(state, "nothing")
            groups[key].append(_untestable(r, meta, state))
            continue
        if kind != "tie":
            direction = "better" if r.delta_low > 0 else "worse"
            kind = direction if kind == "finding" else f"{direction}_unadjusted"
        groups[kind].append(_delta_text(r, meta))
    parts = []
    for kind, said in (("better", f"better than {baseline} (a finding: Holm p < {ALPHA})"),
                       ("worse", f"worse than {baseline} (a finding: Holm p < {ALPHA})"),
                       ("better_unadjusted", f"above {baseline} at 95% unadjusted only "
                                             "(not after Holm)"),
                       ("worse_unadjusted", f"below {baseline} at 95% unadjusted only "
                                            "(not after Holm)")):
        if groups[kind]:
            parts.append(f"{said}: {_join(groups[kind])}")
    if groups["tie"]:
        lead = "not" if parts else "no method is"
        parts.append(f"{lead} distinguishable from {baseline} at 95%: {_join(groups['tie'])}")
    if groups["one_seed"]:
        parts.append(f"one seed, so no interval: {_join(groups['one_seed'])}")
    if groups["constant"]:
        parts.append("the same Δ in every seed, so no spread to test, no p value and no "
                     f"finding: {_join(groups['constant'])}")
    if groups["nothing"]:
        parts.append("nothing to test (Δ = 0 in every seed, no spread): "
                     f"{_join(groups['nothing'])}")
    if groups["none"]:
        parts.append(f"no paired per-problem records: {_join(groups['none'])}")
    if not parts:
        return f"On {name}, {baseline} is the only method."
    return f"On {name}, " + "; ".join(parts) + "."


def gain_sentence(rows: pd.DataFrame, bench: str, initial: float,
                  paired: dict | None = None) -> str:
    """The warm start's score on `bench` and every method's Last gain over it, and which
    methods' intervals lie wholly above it. With `paired` (label -> analysis.stats.Gain,
    from the per-problem scores: analysis.warmstart) the interval counts the questions and
    the warm start's own sampling as well as the seeds; without, the method's seed interval
    is shifted by the warm start's score, taken as fixed."""
    meta = metric_meta(str(rows["metric"].iloc[0]))
    order = {lab: i for i, lab in enumerate(label_order(rows["label"]))}
    if paired and all(label in paired for label in rows["label"]):
        return _paired_gain_sentence(rows, bench, initial, paired, order, meta)
    gains, above, intervals = [], [], 0
    for r in sorted(rows.itertuples(), key=lambda r: order[r.label]):
        text = f"{r.label} {signed(r.mean - initial, meta)}"
        if r.n_seeds > 1 and r.se <= CONSTANT_SD:  # a point "interval" is no evidence
            text += f" (the same in each of {int(r.n_seeds)} seeds: no interval)"
        elif not math.isnan(r.ci95_low) and r.n_seeds > 1:
            intervals += 1
            text += f" [{signed(r.ci95_low - initial, meta)}, {signed(r.ci95_high - initial, meta)}]"
            if r.ci95_low > initial:
                above.append(r.label)
        gains.append(text)
    head = (f"The warm start (the initial model, before any RL step) scores "
            f"{meta.format(initial)} on {benchmark_display(bench)}; gain at Last over it")
    if not intervals:  # one seed each: a gain, but no interval to judge it by
        return f"{head}: {_join(gains)}."
    rise = (f"; its 95% interval lies above the warm start for {_join(above)}" if above else
            "; no method's 95% interval lies wholly above the warm start")
    return (f"{head}, with the method's seed interval less that score (one evaluation, taken "
            f"as fixed): {_join(gains)}{rise}.")


def _paired_gain_sentence(rows, bench: str, initial: float, paired: dict, order, meta) -> str:
    gains, above = [], []
    for label in sorted(set(rows["label"]), key=order.get):
        g = paired[label]
        text = f"{label} {signed(g.gain, meta)}"
        if g.low == g.high:
            text += " (no spread over questions or seeds: no interval)"
        else:
            text += f" [{signed(g.low, meta)}, {signed(g.high, meta)}]"
            above += [label] if g.low > 0 else []
        gains.append(text)
    problems = sorted({g.problems for g in paired.values() if g is not None})
    unit = "percentage points" if meta.fmt == "percent" else "its units"
    rise = (f"; the interval lies above the warm start for {_join(above)}" if above else
            "; no method's interval lies wholly above the warm start")
    return (f"The warm start (the initial model, before any RL step) scores "
            f"{meta.format(initial)} on {benchmark_display(bench)}; gain at Last over it, in "
            f"{unit} on the {'/'.join(map(str, problems))} questions both evaluated, with a 95% "
            "interval paired over questions that counts the questions drawn and the warm "
            "start's own sampling as well as the seeds (analysis.stats.gain_interval): "
            f"{_join(gains)}{rise}.")


def detectable_sentence(bench: str, span: Detectable, meta) -> str:
    """The smallest Δ this design could have detected on `bench` (analysis.power's MDD)."""
    if math.isnan(span.low):
        why = {"one seed": "only one seed is paired with the baseline, so no interval exists",
               "no variation": "every sample scored the same on both sides"}[span.why]
        return (f"On {benchmark_display(bench)} the smallest detectable difference cannot be "
                f"estimated: {why}.")
    lo, hi = span.low, span.high
    low_end, high_end = meta.value_range
    width = high_end - low_end  # no difference on the metric's scale is larger

    def shown(x: float) -> str:
        return meta.format(x) if x <= width else "more than the scale allows"

    size = shown(lo) if math.isclose(lo, hi) or hi > width else f"{shown(lo)}-{shown(hi)}"
    upper = (f"the true size may be up to {shown(span.upper)} (95% upper end)"
             if span.upper <= width else
             f"its 95% upper end is more than the scale allows ({meta.format(width)})")
    return (f"The smallest difference this design detects on {benchmark_display(bench)} "
            f"(paired t over seeds at 95%, 80% power, unadjusted; `python -m analysis power`) "
            f"is {size}, an estimate from a variance on {span.df} df: {upper}, and the point "
            "figure gives less than 80% power.")


def verdict_paragraph(tidy: pd.DataFrame, initial_means: dict[str, float] | None = None,
                      detectable: dict[str, Detectable] | None = None,
                      gains: dict[str, dict] | None = None) -> str:
    """The verdict (see module doc) for one scorer's tidy Last/Best table; `initial_means`
    maps benchmark -> the initial model's Mean@n (fraction), absent when not evaluated;
    `detectable` maps benchmark -> the smallest detectable Δ over methods (analysis.power);
    `gains` maps benchmark -> label -> the paired gain over the warm start (analysis.warmstart)."""
    last = tidy[tidy["stat"] == VERDICT_STAT]
    baseline = str(tidy["baseline"].iloc[0])
    meta = metric_meta(str(tidy["metric"].iloc[0]))
    unit = " (percentage points)" if meta.fmt == "percent" else ""
    seeds = sorted(set(last["n_seeds"]))
    seeds_txt = str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
    seeds_txt += " seed(s) per method" + paired_note(last, baseline)
    k = family_size(last)
    sentences = [
        f"**Verdict** (computed from the tables below: scorer `{tidy['scorer'].iloc[0]}`, "
        f"{metric_name(tidy)} at Last, {seeds_txt}; Δ = method - {baseline}"
        f"{unit}, paired by seed with the training run as the unit, with its 95% paired t "
        f"interval over seeds; K = {k} comparison(s) at Last, read through Holm's "
        f"adjustment: a finding is a Δ whose interval excludes 0 and whose Holm p is below "
        f"{ALPHA})."
    ]
    constant = []  # benchmarks where every run scores the same: nothing to compare
    for bench in benchmark_order(last["benchmark"]):
        rows = last[last["benchmark"] == bench]
        if same_everywhere(rows, baseline):
            constant.append(bench)
            continue
        sentences.append(benchmark_sentence(rows, bench, baseline))
        if detectable and bench in detectable:
            sentences.append(detectable_sentence(bench, detectable[bench], meta))
        if initial_means and bench in initial_means:
            sentences.append(gain_sentence(rows, bench, initial_means[bench],
                                           (gains or {}).get(bench)))
    if constant:  # one sentence for all of them, after those that carry a comparison
        sentences.append(constant_sentence(last, constant, meta, initial_means or {}))
    uneven = uneven_last_sentence(last)
    if uneven:
        sentences.append(uneven)
    return " ".join(sentences)


def paired_note(last: pd.DataFrame, baseline: str) -> str:
    """" (seeds shared with DAPO, all a Δ pairs: only 2 for GRPO)" when some method shares
    fewer seeds with the baseline than it has: its Δ rests on those only."""
    short = []
    for r in last[last["label"] != baseline].drop_duplicates("label").itertuples():
        paired = getattr(r, "delta_seeds", None)
        if paired is not None and not pd.isna(paired) and 0 < int(paired) < int(r.n_seeds):
            short.append(f"{int(paired)} for {r.label}")
    if not short:
        return ""
    return f" (seeds shared with {baseline}, all a Δ pairs: only {', '.join(short)})"


def uneven_last_sentence(last: pd.DataFrame) -> str:
    """Name the methods whose Last is not the sweep's final evaluated step in every seed (a
    missing evaluation), since their Δ then pairs different steps; "" when all agree."""
    if "last_step_min" not in last or last["last_step_max"].isna().all():
        return ""
    final = int(last["last_step_max"].max())
    early = last[last["last_step_min"].astype(float) < final].drop_duplicates("label")
    if early.empty:
        return ""
    names = ", ".join(f"{r.label} (from step {int(r.last_step_min)})" for r in early.itertuples())
    return (f"Last is not one step for every run: the final evaluated step is {final}, but "
            f"some seeds of {names} end earlier (a missing evaluation), so their Δ pairs "
            "different steps; re-run the missing evaluations to compare like with like.")


def same_everywhere(rows: pd.DataFrame, baseline: str) -> bool:
    """The baseline and every method score one and the same value in every seed at Last
    (AIME on a small model: 0 everywhere), so the benchmark carries no comparison."""
    if baseline not in set(rows["label"]) or rows["label"].nunique() < 2:
        return False  # benchmark_sentence says what is missing
    means = rows["mean"].astype(float)
    spread = rows["se"].astype(float).fillna(0)
    return bool(means.notna().all() and means.nunique() == 1 and (spread == 0).all())


def constant_sentence(last: pd.DataFrame, benches: list[str], meta,
                      initial_means: dict[str, float]) -> str:
    """"On AIME24 and AMC23 every run scores 0.00 at Last, as the warm start does: nothing
    to compare." One sentence for every benchmark without a comparison."""
    parts = []
    for value in sorted({float(last[last["benchmark"] == b]["mean"].iloc[0]) for b in benches}):
        group = [b for b in benches
                 if float(last[last["benchmark"] == b]["mean"].iloc[0]) == value]
        names = [benchmark_display(b) for b in group]
        named = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        warm = [initial_means.get(b) for b in group]
        said = (", as the warm start does" if all(w == value for w in warm) else
                "" if all(w is None for w in warm) else
                ", the warm start " + ", ".join(meta.format(w) for w in warm if w is not None))
        parts.append(f"On {named} every run scores {meta.format(value)} in every seed at "
                     f"Last{said}")
    return "; ".join(parts) + ": nothing to compare there."


def _separation(delta: float, low: float, high: float, p_holm: float, detectable: float,
                fmt, seeds: int) -> str:
    """"+1.20 [-2.10, +4.50] (not separated; detectable 4.80)" in `fmt`'s units; a
    separation says whether it survives Holm."""
    if math.isnan(delta):
        return "n/a (no paired runs)"
    size = "" if math.isnan(detectable) else f"; detectable {fmt(detectable, False)}"
    state = delta_state(delta, low, seeds)
    if state != "tested":
        why = {"one seed": "one seed: no interval",
               "constant": f"the same in each of {seeds} seeds: no spread, not tested"}
        return f"{fmt(delta, True)} ({why.get(state, 'nothing to test')}{size})"
    said = {"tie": "not separated",
            "finding": f"separated, a finding: Holm p {format_p(p_holm)}",
            "unadjusted": f"separated unadjusted only: Holm p {format_p(p_holm)}",
            "untested": "not tested: no variation"}[reading(low, high, p_holm)]
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
    k = family_size(rows, "delta_p") + family_size(rows, "kl_p")
    sentences = [
        f"**Contrasts** (computed: at Last on {bench}, {seeds_txt} seed(s) per cell, paired by "
        "seed with the training run as the unit; accuracy Δ = cell - partner in percentage "
        "points and KL Δ = the difference of KL(pi_ckpt || pi_init) in nats per response, "
        "each with its 95% paired t interval over seeds; separated = the interval excludes 0; "
        f"K = {k} comparisons (accuracy and KL), read through Holm's adjustment: a finding "
        f"survives it at {ALPHA}; detectable = the smallest Δ this design detects at 95% "
        "with 80% power)."]
    for contrast, group in rows.groupby("contrast", sort=False):
        parts = []
        for r in group.itertuples():
            acc = _separation(r.delta, r.delta_low, r.delta_high, r.delta_p_holm, r.mdd, _points,
                              int(r.delta_seeds))
            kl = _separation(r.kl_delta, r.kl_low, r.kl_high, r.kl_p_holm, r.kl_mdd, _nats,
                             int(r.kl_seeds))
            parts.append(f"{r.label} vs {r.partner}: accuracy {acc}, KL {kl}")
        sentences.append(f"{CONTRAST_NAMES[contrast][0].upper()}"
                         f"{CONTRAST_NAMES[contrast][1:]}: {'; '.join(parts)}.")
    return " ".join(sentences)
