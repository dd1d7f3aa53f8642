"""rollout.top_p < 1 is refused before any job, through the sweep's validation entry point
(`python -m sweep cells`, what the Snakefile's parse-time checks run), for every objective:
each one's gradient depends on the behaviour policy, which full-softmax log-probs misstate
under nucleus sampling. eval.top_p is not affected."""

import pytest
import yaml

from algorithms import METHODS, OBJECTIVES
from sweep.__main__ import main

# one registered method per objective
BY_OBJECTIVE = {m.loss.objective: name for name, m in reversed(list(METHODS.items()))}


def write_sweep(tmp_path, method: str, rollout_top_p: float, eval_top_p: float = 1.0):
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({
        "name": "t", "base": {"rollout": {"top_p": rollout_top_p}}, "methods": [method],
        "eval": {"steps": [1], "benchmarks": ["toy"], "top_p": eval_top_p}}))
    return str(path)


def test_every_objective_has_a_method_and_depends_on_the_behaviour_policy():
    assert set(BY_OBJECTIVE) == set(OBJECTIVES)
    assert all(obj.uses_behaviour for obj in OBJECTIVES.values())


@pytest.mark.parametrize("objective", sorted(BY_OBJECTIVE))
def test_top_p_below_one_is_refused_in_one_line(tmp_path, capsys, objective):
    assert main(["cells", write_sweep(tmp_path, BY_OBJECTIVE[objective], 0.9)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "rollout.top_p=0.9" in err and "full-softmax" in err
    assert f"objective {objective!r}" in err and "set rollout.top_p: 1" in err


def test_top_p_one_and_an_eval_top_p_below_one_pass(tmp_path, capsys):
    assert main(["cells", write_sweep(tmp_path, "RPG-REINFORCE-URKL", 1.0, eval_top_p=0.9)]) == 0
    assert "1 runs" in capsys.readouterr().err
