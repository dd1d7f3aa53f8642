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


def gaming_sentence(eval_df: pd.DataFrame, initial: pd.DataFrame, verdict_scorer: str) -> str:
    """The verdict's sentence: which runs lead far more than the warm start, or that none
    does; "" when no benchmark was graded by a strict and a lenient scorer at both ends."""
    strict = strict_scorer(eval_df, verdict_scorer)
    all_leads = leads(eval_df, initial, strict) if strict else []
    if not all_leads:
        return ""
    meta = metric_meta("mean")
    parts = []
    for bench in benchmark_order({lead.benchmark for lead in all_leads}):
        for lenient in sorted({lead.lenient for lead in all_leads if lead.benchmark == bench}):
            group = [x for x in all_leads if x.benchmark == bench and x.lenient == lenient]
            warm = group[0].warm_lead
            if warm == 0 and all(x.lead == 0 for x in group):
                continue  # both scorers agree on every run (AIME on a tiny model: all 0)
            gamed = [x for x in group if x.lead - warm >= GAMING_MARGIN]
            where = (f"on {benchmark_display(bench)} the lenient `{lenient}` less the strict "
                     f"`{strict}` is {signed(warm, meta)} points at the warm start")
            if gamed:
                runs = ", ".join(f"`{x.run_id}` ({signed(x.lead, meta)})"
                                 for x in sorted(gamed, key=lambda x: x.run_id))
                parts.append(f"{where}, and {meta.format(GAMING_MARGIN)} or more above that at "
                             f"Last in {runs}: they may have learned text the lenient "
                             "scorer credits and the task does not; the answer forms below, "
                             "and `python tools/answer_forms.py` on the sweep's folder (or a "
                             "snapshot's samples/), show their answers")
            else:
                top = max(x.lead for x in group)
                parts.append(f"{where} and at most {signed(top, meta)} in any run at Last, "
                             f"so no run games it ({meta.format(GAMING_MARGIN)} points more "
                             "than the warm start would flag one)")
    return "Grader check: " + "; ".join(parts) + "." if parts else ""
