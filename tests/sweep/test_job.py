"""python -m sweep.job (eval.group: train): the trainer's arguments before `--`, the
evaluation's after; no evaluation unless training finished; the sweep refuses the grouping
with several training processes."""

from __future__ import annotations

import pytest
import yaml

from sweep.job import main, split_argv
from sweep.runconfig import train_command
from sweep.spec import SweepError, parse_sweep

SWEEP = {"name": "x", "methods": ["GRPO"], "eval": {"steps": [2], "benchmarks": ["toy"],
                                                   "group": "train"}}


def test_argv_splits_at_the_first_double_dash():
    assert split_argv(["--config", "a.yaml", "--", "--checkpoint", "c", "--", "x"]) == (
        ["--config", "a.yaml"], ["--checkpoint", "c", "--", "x"])
    with pytest.raises(ValueError, match="after `--`"):
        split_argv(["--config", "a.yaml"])


def test_no_double_dash_is_a_usage_error(capsys):
    assert main(["--config", "a.yaml"]) == 2
    assert "after `--`" in capsys.readouterr().err


def test_a_failed_training_returns_its_code_and_evaluates_nothing(tmp_path, capsys):
    bad = tmp_path / "run.yaml"
    bad.write_text(yaml.safe_dump({"optim": {"steps": 0}}))
    out = tmp_path / "eval"
    code = main(["--config", str(bad), "--", "--checkpoint", str(tmp_path / "none"),
                 "--benchmark", "toy", "--out", str(out)])
    assert code == 2
    assert "optim.steps" in capsys.readouterr().err
    assert not out.exists()


def test_the_train_group_launches_one_process_and_refuses_several():
    assert train_command(parse_sweep(SWEEP)) == "python -m sweep.job"
    with pytest.raises(SweepError, match="eval.group: train .* 4 GPUs"):
        parse_sweep({**SWEEP, "resources": {"train": {"gpus": 4}}})
