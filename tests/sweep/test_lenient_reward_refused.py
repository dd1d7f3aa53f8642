"""A sweep that trains on a lenient scorer is refused in one line before any job, naming the
strict scorer of its template, unless it opts in with base.task.allow_gameable_reward
(issue 51: a seed trained on math_verify restated the question in 93% of its answers).
Through `python -m sweep cells`, the entry point the Snakefile's parse-time checks share.
A lighteval cross-check of a prompt it cannot send is refused the same way."""

import pytest
import yaml

from sweep.__main__ import main


def write_sweep(tmp_path, **task):
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({
        "name": "t", "base": {"task": task}, "methods": ["DAPO"],
        "eval": {"steps": [1], "benchmarks": ["toy"], "scorers": ["math_verify"]}}))
    return str(path)


@pytest.mark.parametrize(("template", "strict"), [
    ("boxed", "math_verify_boxed"), ("boxed_1shot", "math_verify_boxed"), ("dapo", "dapo")])
def test_a_lenient_training_reward_is_refused_in_one_line(tmp_path, capsys, template, strict):
    assert main(["cells", write_sweep(tmp_path, scorer="math_verify", template=template)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "base.task.scorer='math_verify' is lenient" in err
    assert f"train on {strict!r}, the strict scorer of template {template!r}" in err
    assert "base.task.allow_gameable_reward: true" in err


def test_an_explicit_opt_in_and_strict_rewards_pass(tmp_path, capsys):
    opted = write_sweep(tmp_path, scorer="math_verify", template="boxed",
                        allow_gameable_reward=True)
    assert main(["cells", opted]) == 0
    for scorer in ("dapo", "math_verify_boxed"):  # math_verify stays an eval scorer
        assert main(["cells", write_sweep(tmp_path, scorer=scorer, template="boxed")]) == 0
    assert capsys.readouterr().err.count("1 runs") == 3


@pytest.mark.parametrize(("task", "says"), [
    ({"template": "boxed_1shot", "scorer": "math_verify_boxed"}, "worked-example turns"),
    ({"chat": {"enable_thinking": False}}, "enable_thinking=False")])
def test_the_lighteval_crosscheck_refuses_a_prompt_it_cannot_send(tmp_path, capsys, task, says):
    """lighteval sends one user message: the example turns and the thinking switch would be
    lost, and the cross-check would score another prompt than ours."""
    path = write_sweep(tmp_path, **task)
    data = yaml.safe_load(open(path))
    data["eval"]["crosscheck"] = ["lighteval"]
    open(path, "w").write(yaml.safe_dump(data))
    assert main(["cells", path]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "eval.crosscheck: lighteval" in err and says in err
