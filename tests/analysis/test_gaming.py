"""The grader check: a run whose lenient score runs ahead of the strict one by far more than at
the warm start is named in the verdict; runs that only learned are not; the shipped 8-step
real-model snapshot, trained on the lenient grader, is caught on every run."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analysis.gaming import GAMING_MARGIN, gaming_sentence, leads, strict_scorer
from analysis.snapshot import read_published

REPO = Path(__file__).resolve().parents[2]


def _evals(rows: dict[str, tuple[float, float]]) -> pd.DataFrame:
    """run_id -> (strict math_verify_boxed, lenient math_verify) at Last, on arithmetic."""
    out = []
    for seed, (run_id, (strict, lenient)) in enumerate(rows.items()):
        for scorer, mean in (("math_verify_boxed", strict), ("math_verify", lenient)):
            out.append({"run_id": run_id, "label": run_id.split("_")[0], "seed": seed,
                        "step": 32, "benchmark": "arithmetic", "scorer": scorer, "n": 4,
                        "mean": mean})
    return pd.DataFrame(out)


INITIAL = pd.DataFrame([
    {"step": 0, "benchmark": "arithmetic", "scorer": "math_verify_boxed", "mean": 0.30},
    {"step": 0, "benchmark": "arithmetic", "scorer": "math_verify", "mean": 0.35}])


def test_a_run_that_games_the_lenient_grader_is_named():
    # LEARN: both scorers rise together (lead 0.05, as at the warm start); GAME: strict falls
    # to 0.02 while the lenient one credits 0.90 (lead 0.88, 0.83 more than the warm start)
    evals = _evals({"LEARN_s0": (0.55, 0.60), "GAME_s1": (0.02, 0.90), "EDGE_s2": (0.40, 0.54)})
    by_run = {x.run_id: x for x in leads(evals, INITIAL, "math_verify_boxed")}
    assert by_run["GAME_s1"].lead == pytest.approx(0.88)
    assert by_run["GAME_s1"].warm_lead == pytest.approx(0.05)
    text = gaming_sentence(evals, INITIAL, "math_verify_boxed")
    assert text == (
        "Grader check: on Arithmetic the lenient `math_verify` less the strict "
        "`math_verify_boxed` is +5.00 points at the warm start, and 10.00 points or more "
        "above that at Last in `GAME_s1` (+88.00): they may have learned text the lenient scorer credits "
        "and the task does not; the answer forms below, and `python tools/answer_forms.py` on "
        "the sweep's folder (or a snapshot's samples/), show their answers.")
    # EDGE leads by 0.14, 0.09 more than the warm start: under the margin
    assert by_run["EDGE_s2"].lead - by_run["EDGE_s2"].warm_lead < GAMING_MARGIN


def test_no_gamed_run_is_said_so_and_a_lenient_verdict_scorer_is_not_the_strict_one():
    evals = _evals({"LEARN_s0": (0.55, 0.60)})
    # the verdict reads the lenient scorer: the check still pairs it with the strict one
    assert strict_scorer(evals, "math_verify") == "math_verify_boxed"
    text = gaming_sentence(evals, INITIAL, "math_verify")
    assert text.endswith("at most +5.00 in any run at Last, so no run games it (10.00 points "
                         "more than the warm start would flag one).")
    lenient_only = evals[evals["scorer"] == "math_verify"]
    assert gaming_sentence(lenient_only, INITIAL, "math_verify") == ""
    assert gaming_sentence(evals, INITIAL.iloc[:0], "math_verify_boxed") == ""  # no warm start


def _sized(evals: pd.DataFrame, problems: int) -> pd.DataFrame:
    return evals.assign(num_problems=problems)


def test_the_threshold_is_said_in_answers_and_a_tiny_benchmark_is_not_checked():
    """With 40 problems x 4 samples the 10-point threshold is 16 of a run's 160 answers; with
    2 problems x 4 samples (AMC23 in the real-model sweep) one answer moves the lead 12.50
    points, so nothing could be told from it and the check says so instead of flagging."""
    evals = _evals({"LEARN_s0": (0.55, 0.60)})
    assert "(10.00 points, 16 of a run's 160 answers, more than the warm start would flag one)" \
        in gaming_sentence(_sized(evals, 40), INITIAL, "math_verify_boxed")
    tiny = gaming_sentence(_sized(_evals({"GAME_s1": (0.0, 0.875)}), 2), INITIAL,
                           "math_verify_boxed")
    assert "but Arithmetic is too small for the check: a run's Last rests on 8 answers, so " \
           "one answer moves the lead by 12.50 points, more than the 10.00 that would flag " \
           "a run" in tiny and "`GAME_s1`" not in tiny


def test_benchmarks_where_both_scorers_agree_everywhere_are_named():
    """The best result the check can have (lead 0 at the warm start and in every run) is
    reported, not dropped: the real-model report spoke of AMC23 only."""
    evals = _evals({"LEARN_s0": (0.55, 0.55), "LEARN_s1": (0.40, 0.40)})
    initial = INITIAL.assign(mean=0.30)
    assert gaming_sentence(evals, initial, "math_verify_boxed") == (
        "Grader check: on Arithmetic the lenient `math_verify` and the strict "
        "`math_verify_boxed` agree on every run (lead 0.00 at the warm start and at Last).")


def test_the_real_model_report_names_arithmetic_and_leads_its_verdict_with_it():
    report = (REPO / "docs" / "runs" / "real-cpu" / "report.md").read_text()
    verdict = next(line for line in report.splitlines() if "**Verdict**" in line)
    assert "Grader check: on AIME24 and Arithmetic the lenient `math_verify` and the strict " \
           "`math_verify_boxed` agree on every run" in verdict
    after_opening = verdict.split("). ", 1)[1]
    assert after_opening.startswith("On Arithmetic, ")
    assert "On AIME24 and AMC23 every run scores 0.00 in every seed at Last, as the warm " \
           "start does: nothing to compare there." in verdict
    assert "was not evaluated; using" not in verdict


def test_the_lenient_real_model_snapshot_is_caught_on_every_run():
    evals, _, initial = read_published(REPO / "docs" / "runs" / "real-cpu-lenient")
    text = gaming_sentence(evals, initial, "math_verify")
    runs = sorted(set(evals["run_id"]))
    assert len(runs) == 6 and all(f"`{r}` (+" in text for r in runs)
    assert "they may have learned text the lenient scorer credits" in text
