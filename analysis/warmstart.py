"""The gain over the warm start, per method and benchmark, from the per-problem scores.

The warm start (the initial model, before any RL step) is one evaluation of the benchmark's
questions, so its score is uncertain as a seed's is. `warm_start_gains` pairs every method's
Last per-problem scores (each seed at its own Last step) with the warm start's on the same
questions and gives `analysis.stats.gain_interval`: the gain with an interval that counts
the questions and the warm start's sampling as well as the seeds.
"""

from __future__ import annotations

import pandas as pd

from analysis.delta import Scores
from analysis.stats import Gain, gain_interval
from common.layout import INITIAL_DIR


def warm_start_gains(per_run: pd.DataFrame, scores: Scores, scorer: str
                     ) -> dict[str, dict[str, Gain]]:
    """benchmark -> label -> its Gain, where the warm start's and every seed's per-problem
    scores exist for `scorer` (`per_run`: analysis.tables.per_run_last_best rows); {} where
    none do, and the verdict then keeps the warm start as one fixed number."""
    out: dict[str, dict[str, Gain]] = {}
    for (label, bench), group in per_run.groupby(["label", "benchmark"], sort=False):
        warm = scores(INITIAL_DIR, 0, str(bench)).get(scorer)
        seeds = [scores(r.run_id, int(r.last_step), str(bench)).get(scorer)
                 for r in group.itertuples()]
        if not warm or not all(seeds):
            continue
        shared = sorted(set(warm).intersection(*seeds))  # the questions both evaluated
        if len(shared) < 2:
            continue
        out.setdefault(str(bench), {})[str(label)] = gain_interval(
            [[s[p] for p in shared] for s in seeds], [warm[p] for p in shared])
    return out
