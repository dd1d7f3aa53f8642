"""python -m sweep.job (eval.group: train): the trainer's arguments before `--`, the
evaluation's after; no evaluation unless training finished; the sweep refuses the grouping
with several training processes."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

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


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from trainer.tiny import TinyConfig, build_tiny

    config = TinyConfig(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                        sft_steps=20, sft_batch_size=16, sft_lr=5e-3)
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", config, progress=False)


def _sigterm_after(metrics: Path, lines: int) -> threading.Thread:
    """A thread that sends this process SIGTERM (a preemption, as SLURM's scancel or time
    limit does) once `metrics` holds `lines` steps, wherever that falls in time."""

    def watch():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= lines:
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_preempted_training_evaluates_nothing_and_the_rerun_resumes_then_evaluates(
        tiny_model, tmp_path, capsys):
    """SIGTERM mid-run: the trainer saves and the job returns 75 with no evaluation; the
    rerun (as Snakemake's retry is) resumes, finishes, then evaluates."""
    from common.layout import RunDir
    from trainer.checkpoint import PREEMPTED_EXIT_CODE

    steps = 16
    out = RunDir(tmp_path / "runs" / "r")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "run_id": "r", "out_dir": str(out.root), "seed": 0,
        "model": {"path": str(tiny_model), "device": "cpu"},
        "rollout": {"n": 2, "prompts_per_step": 2, "max_new_tokens": 8, "overlong_buffer": 2,
                    "dynamic_sampling": False},
        "optim": {"steps": steps, "lr": 1e-3},
        # the signal comes at step 2: 14 steps of at least 0.5 s still to go
        "debug": {"sleep_per_step_s": 0.5},
        "checkpoint": {"eval_steps": [steps]},
        "tracking": {"mlflow_uri": None, "progress": False}}))
    evaluation = ["--checkpoint", str(out.checkpoint(steps)), "--benchmark", "toy",
                  "--out", str(tmp_path / "eval"), "--n", "1", "--limit", "2",
                  "--max-new-tokens", "8", "--no-kl", "--no-progress"]

    watcher = _sigterm_after(out.root / "metrics.jsonl", lines=2)
    code = main(["--config", str(config), "--", *evaluation])
    watcher.join(timeout=1)
    assert code == PREEMPTED_EXIT_CODE, capsys.readouterr().err[-2000:]
    assert 2 <= len(logged_steps(out.root)) < steps and not out.done.exists()
    assert (out.root / "state" / "resume.pt").exists() and not (tmp_path / "eval").exists()

    assert main(["--config", str(config), "--", *evaluation]) == 0
    assert logged_steps(out.root) == list(range(1, steps + 1))
    assert json.loads((tmp_path / "eval" / "toy.json").read_text())["num_problems"] == 2


def logged_steps(run: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
