"""eval.limit_before_last: the eval steps before the last evaluate fewer problems (a cheaper
learning curve); the last step and the initial model's step 0 evaluate eval.limit, so Last
and its baseline are measured on the same, larger set. Followed from the sweep's arguments
through the eval CLI's parsing to each evaluation's config."""

from __future__ import annotations

import pytest

from eval.__main__ import eval_configs, eval_parser
from sweep.runconfig import eval_argv, initial_eval_args
from sweep.spec import SweepError, parse_sweep


def sweep(**evals):
    return parse_sweep({
        "name": "t", "base": {"task": {"kind": "arithmetic"}, "optim": {"steps": 30}},
        "methods": ["DAPO"], "mlflow": {"enabled": False},
        "eval": {"steps": [10, 20, 30], "benchmarks": ["arithmetic", "toy"], **evals}})


def limits(argv: list[str]) -> dict[tuple[int, str], int | None]:
    """(step, benchmark) -> the problem limit each evaluation runs with."""
    return {(int(c.out.rsplit("_", 1)[1]), c.benchmark): c.limit
            for c in eval_configs(eval_parser().parse_args(argv))}


def test_steps_before_the_last_take_the_smaller_limit():
    s = sweep(limit={"arithmetic": 100}, limit_before_last={"arithmetic": 40})
    got = limits(eval_argv(s, "dapo_s0", [10, 20, 30], ["arithmetic", "toy"]))
    assert got == {(10, "arithmetic"): 40, (20, "arithmetic"): 40, (30, "arithmetic"): 100,
                   (10, "toy"): None, (20, "toy"): None, (30, "toy"): None}
    # one checkpoint per job (eval.group: checkpoint) decides the same way
    assert limits(eval_argv(s, "dapo_s0", [20], ["arithmetic"])) == {(20, "arithmetic"): 40}
    assert limits(eval_argv(s, "dapo_s0", [30], ["arithmetic"])) == {(30, "arithmetic"): 100}
    assert "--limit-at" not in initial_eval_args(s, ["arithmetic"])  # the baseline: all 100


def test_without_it_every_step_takes_eval_limit():
    got = limits(eval_argv(sweep(limit={"arithmetic": 100}), "dapo_s0", [10, 30], ["arithmetic"]))
    assert got == {(10, "arithmetic"): 100, (30, "arithmetic"): 100}


@pytest.mark.parametrize(("evals", "message"), [
    ({"limit": {"arithmetic": 40}, "limit_before_last": {"arithmetic": 40}},
     "eval.limit_before_last.arithmetic=40 is not below eval.limit.arithmetic=40"),
    ({"limit_before_last": {"aime24": 5}}, "eval.limit_before_last names ['aime24']"),
    ({"limit_before_last": {"arithmetic": 0}}, "limit_before_last.arithmetic"),
])
def test_bad_settings_are_refused_at_parse_time(evals, message):
    with pytest.raises(SweepError) as err:
        sweep(**evals)
    assert message in str(err.value)


def test_the_cli_refuses_a_step_it_does_not_evaluate():
    argv = ["--checkpoint", "r/step_10", "--benchmark", "toy", "--out", "o/step_{step}",
            "--limit-at", "20:toy=5"]
    with pytest.raises(ValueError, match=r"--limit-at names step\(s\) \[20\], which no "
                       r"--checkpoint is \(their steps: \[10\]\)"):
        eval_configs(eval_parser().parse_args(argv))
    with pytest.raises(ValueError, match="write STEP:BENCH=N"):
        eval_configs(eval_parser().parse_args(argv[:-1] + ["toy=5"]))
