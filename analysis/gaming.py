"""Does a run game its grader? A lenient scorer (common.grading: one that reads an answer
anywhere in the text) running ahead of the strict one (the answer only where the prompt asked
for it) by far more than at the warm start means the policy found text the lenient scorer
credits and the task does not: the real-model run that learned to restate "32 + 48 = ?" led
math_verify over the boxed scorer by 88-93 points against 5 at its warm start.

For each benchmark graded by the verdict's strict scorer and a lenient one, a run's lead is
its Last Mean@n under the lenient scorer less the strict one; the warm start's lead is the
initial model's. A run whose lead exceeds the warm start's by GAMING_MARGIN or more is named in
the verdict, with the command that shows its answers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from analysis.tables import benchmark_display, benchmark_order, per_run_last_best, signed
from common.grading import SCORERS
from common.metrics import metric_meta

GAMING_MARGIN = 0.10  # 10 points more lead than at the warm start: far beyond seed noise here


@dataclass(frozen=True)
class Lead:
    benchmark: str
    lenient: str
    run_id: str
    lead: float
    warm_lead: float


def leads(eval_df: pd.DataFrame, initial: pd.DataFrame, strict: str) -> list[Lead]:
    """Every run's lead of each lenient scorer over `strict` at Last, beside the warm
    start's, on benchmarks where the initial model was graded by both."""
    graded = set(eval_df["scorer"])
    if strict not in graded or not SCORERS[strict].strict or initial.empty:
        return []
    warm = {(str(r.benchmark), str(r.scorer)): float(r.mean) for r in initial.itertuples()}
    out = []
    mine = per_run_last_best(eval_df, strict).set_index(["run_id", "benchmark"])["last"]
    for lenient in [s for s in sorted(graded) if s in SCORERS and not SCORERS[s].strict]:
        theirs = per_run_last_best(eval_df, lenient).set_index(["run_id", "benchmark"])["last"]
        for (run_id, bench), value in theirs.items():
            w_strict, w_lenient = warm.get((bench, strict)), warm.get((bench, lenient))
            if (run_id, bench) in mine.index and None not in (w_strict, w_lenient):
                out.append(Lead(bench, lenient, run_id, value - mine[(run_id, bench)],
                                w_lenient - w_strict))
    return out


def strict_scorer(eval_df: pd.DataFrame, verdict_scorer: str) -> str | None:
    """The strict scorer the check reads: the verdict's when it is strict, else the first
    strict one graded (registry order); None when no strict scorer was graded."""
    graded = set(eval_df["scorer"]) if not eval_df.empty else set()
    names = [verdict_scorer] + [n for n, s in SCORERS.items() if s.strict]
    return next((n for n in names if n in graded and n in SCORERS and SCORERS[n].strict), None)


def answers_at_last(eval_df: pd.DataFrame, bench: str, scorer: str) -> int:
    """Answers one run's Last Mean@n on `bench` rests on (problems x samples); 0 unknown."""
    rows = eval_df[(eval_df["benchmark"] == bench) & (eval_df["scorer"] == scorer)]
    if rows.empty or "num_problems" not in rows or "n" not in rows:
        return 0
    last = rows[rows["step"] == rows["step"].max()]
    total = (last["num_problems"] * last["n"]).dropna()
    return int(total.min()) if not total.empty else 0


def gaming_sentence(eval_df: pd.DataFrame, initial: pd.DataFrame, verdict_scorer: str) -> str:
    """The verdict's sentence over every benchmark graded by a strict and a lenient scorer at
    both ends: where the two agree on every run, where a benchmark is too small for the
    check (one answer moves the lead by GAMING_MARGIN or more), which runs lead far more
    than the warm start, or that none does; "" when there is nothing to check."""
    strict = strict_scorer(eval_df, verdict_scorer)
    all_leads = leads(eval_df, initial, strict) if strict else []
    if not all_leads:
        return ""
    meta = metric_meta("mean")
    agree, parts = [], []
    for bench in benchmark_order({lead.benchmark for lead in all_leads}):
        for lenient in sorted({lead.lenient for lead in all_leads if lead.benchmark == bench}):
            group = [x for x in all_leads if x.benchmark == bench and x.lenient == lenient]
            warm, name = group[0].warm_lead, benchmark_display(bench)
            if warm == 0 and all(x.lead == 0 for x in group):
                agree.append((name, lenient))  # the best result the check can have
                continue
            answers = answers_at_last(eval_df, bench, strict)
            where = (f"on {name} the lenient `{lenient}` less the strict `{strict}` is "
                     f"{signed(warm, meta)} points at the warm start")
            if answers and 1 / answers >= GAMING_MARGIN:
                parts.append(f"{where}, but {name} is too small for the check: a run's Last "
                             f"rests on {answers} answers, so one answer moves the lead by "
                             f"{meta.format(1 / answers)} points, more than the "
                             f"{meta.format(GAMING_MARGIN)} that would flag a run")
                continue
            gamed = [x for x in group if x.lead - warm >= GAMING_MARGIN]
            threshold = (f"{meta.format(GAMING_MARGIN)} points"
                         + (f", {math.ceil(GAMING_MARGIN * answers - 1e-9)} of a run's {answers} "
                            "answers," if answers else ""))
            if gamed:
                runs = ", ".join(f"`{x.run_id}` ({signed(x.lead, meta)})"
                                 for x in sorted(gamed, key=lambda x: x.run_id))
                parts.append(f"{where}, and {threshold} or more above that at Last in {runs}: "
                             "they may have learned text the lenient scorer credits and the "
                             "task does not; the answer forms below, and `python "
                             "tools/answer_forms.py` on the sweep's folder (or a snapshot's "
                             "samples/), show their answers")
            else:
                top = max(x.lead for x in group)
                parts.append(f"{where} and at most {signed(top, meta)} in any run at Last, "
                             f"so no run games it ({threshold} more than the warm start would "
                             "flag one)")
    if agree:
        names = sorted({name for name, _ in agree}, key=[n for n, _ in agree].index)
        pairs = sorted({f"`{lenient}`" for _, lenient in agree})
        parts.insert(0, f"on {_join(names)} the lenient {_join(pairs)} and the strict "
                        f"`{strict}` agree on every run (lead 0.00 at the warm start and at "
                        "Last)")
    return "Grader check: " + "; ".join(parts) + "."


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
