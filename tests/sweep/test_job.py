"""python -m sweep.job (eval.group: train): the trainer's arguments before `--`, the
evaluation's after; no evaluation unless training finished; the sweep refuses the grouping
with several training processes."""

from __future__ import annotations

import json
import os
import re
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


# ------------------------------------------------------------ --runs: several runs, one process


def _run_config(tmp_path: Path, model: Path, run_id: str, seed: int, steps: int = 3) -> Path:
    path = tmp_path / f"{run_id}.yaml"
    path.write_text(yaml.safe_dump({
        "run_id": run_id, "out_dir": str(tmp_path / "runs" / run_id), "seed": seed,
        "model": {"path": str(model), "device": "cpu"},
        "rollout": {"n": 2, "prompts_per_step": 2, "max_new_tokens": 8, "overlong_buffer": 2,
                    "dynamic_sampling": False},
        "optim": {"steps": steps, "lr": 1e-3},
        "checkpoint": {"eval_steps": [steps]},
        "tracking": {"mlflow_uri": None, "progress": False}}))
    return path


def _evaluation(tmp_path: Path, run_id: str, steps: int = 3) -> list[str]:
    run = tmp_path / "runs" / run_id
    return ["--checkpoint", str(run / "checkpoints" / f"step_{steps}"), "--benchmark", "toy",
            "--out", str(run / "eval" / f"step_{steps}"), "--n", "2", "--limit", "3",
            "--max-new-tokens", "8", "--no-progress", "--seed", "0"]


def _outputs(root: Path) -> dict[str, str]:
    """Every run's metrics and evaluation records under `root`, timing keys dropped and the
    folder's own path (the records name their checkpoint) written as ROOT."""
    from perf.same_numbers import compared_files, records

    return {str(rel): json.dumps(records(root / rel)).replace(str(root), "ROOT")
            for rel in compared_files(root)}


def test_runs_in_one_process_give_each_its_own_processes_numbers_and_log(tiny_model,
                                                                         tmp_path):
    """`--runs` trains and evaluates two seeds one after another in one process: the
    metrics and evaluation records equal those of a process per run, each run's output is
    in its own log, and only the first run pays the start-up (job_times.json)."""
    import subprocess
    import sys

    from common.layout import RunDir
    from perf.same_numbers import compared_files

    together, apart = tmp_path / "together", tmp_path / "apart"
    runs = []
    for seed in (0, 1):
        run_id = f"r_s{seed}"
        for root in (together, apart):
            root.mkdir(exist_ok=True)
            _run_config(root, tiny_model, run_id, seed)
        runs.append({"log": str(together / "logs" / f"{run_id}.log"),
                     "train": ["--config", str(together / f"{run_id}.yaml")],
                     "eval": _evaluation(together, run_id)})
        subprocess.run([sys.executable, "-m", "sweep.job", "--config",
                        str(apart / f"{run_id}.yaml"), "--", *_evaluation(apart, run_id)],
                       check=True, capture_output=True)
    job = subprocess.run([sys.executable, "-m", "sweep.job", "--runs", json.dumps(runs)],
                         capture_output=True, text=True)
    assert job.returncode == 0, job.stderr[-2000:]
    assert len(compared_files(apart)) == 6  # 2 x (metrics.jsonl, toy.json, toy.jsonl)
    assert _outputs(together) == _outputs(apart)
    for seed in (0, 1):
        log = (together / "logs" / f"r_s{seed}.log").read_text()
        assert f"runs/r_s{seed}" in log and f"runs/r_s{1 - seed}" not in log, log[-2000:]
    first, second = (json.loads(RunDir(together / "runs" / f"r_s{s}").job_times.read_text())
                     for s in (0, 1))
    assert first["start_up_s"] > 1.0 > second["start_up_s"]  # imports: seconds vs cached
    assert first["train_s"] > 0 and first["eval_s"] > 0


def test_the_first_failing_run_ends_the_job_with_its_code(tiny_model, tmp_path):
    """A refused config (exit 2) in the middle: its message is in its own log, the job exits
    2 naming that log, and the run after it never starts."""
    import subprocess
    import sys

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"optim": {"steps": 0}}))
    good = _run_config(tmp_path, tiny_model, "good", 0)
    runs = [{"log": str(tmp_path / "bad.log"), "train": ["--config", str(bad)], "eval": None},
            {"log": str(tmp_path / "good.log"), "train": ["--config", str(good)], "eval": None}]
    job = subprocess.run([sys.executable, "-m", "sweep.job", "--runs", json.dumps(runs)],
                         capture_output=True, text=True)
    assert job.returncode == 2
    assert "optim.steps" in (tmp_path / "bad.log").read_text()
    assert "bad.log: exit 2; the job stops here" in job.stderr
    assert not (tmp_path / "good.log").exists() and not (tmp_path / "runs" / "good").exists()


@pytest.mark.parametrize(("runs", "message"), [
    ("[", "not JSON"),
    ("[]", "non-empty JSON list"),
    ('[{"log": "a", "train": []}]', r"--runs\[0\]: expected"),
    ('[{"log": "a", "train": "x", "eval": null}]', r"--runs\[0\]: expected"),
])
def test_a_bad_runs_list_is_a_usage_error(runs, message, capsys):
    assert main(["--runs", runs]) == 2
    assert re.search(message, capsys.readouterr().err)


def test_seeds_together_is_refused_where_a_run_is_not_one_process():
    with pytest.raises(SweepError, match="seeds_together .* 2 GPUs"):
        parse_sweep({**SWEEP, "eval": {**SWEEP["eval"], "group": "run"},
                     "resources": {"train": {"gpus": 2, "seeds_together": True}}})
    with pytest.raises(SweepError, match="eval.group: checkpoint trains each run in segments"):
        parse_sweep({**SWEEP, "eval": {**SWEEP["eval"], "group": "checkpoint"},
                     "resources": {"train": {"seeds_together": True}}})
    with pytest.raises(SweepError, match="only training jobs take several seeds"):
        parse_sweep({**SWEEP, "resources": {"evaluate": {"seeds_together": True}}})
