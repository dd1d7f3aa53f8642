"""perf/main_job_profile.py's phases, on a constructed sweep folder: each run's
job_times.json and metrics.jsonl summed, the rest of the train jobs' wall time as the job's
rest, shares of that wall time."""

from __future__ import annotations

import json

import pytest

from common.layout import RunDir
from perf.main_job_profile import phase_table, run_phases


def _run(root, run_id, start_up, train, evaluation, steps):
    run = RunDir(root / "runs" / run_id)
    run.root.mkdir(parents=True)
    run.job_times.write_text(json.dumps(
        {"start_up_s": start_up, "train_s": train, "eval_s": evaluation}))
    run.metrics.write_text("".join(
        json.dumps({"step": i + 1, **s}) + "\n" for i, s in enumerate(steps)))


STEP = {"time_rollout": 1.0, "time_logprob": 0.5, "time_update": 2.0, "time_step": 4.0}


def test_phases_of_a_run_add_up_to_its_job_times(tmp_path):
    _run(tmp_path, "a_s0", 4.0, 10.0, 3.0, [STEP, STEP])
    phases = run_phases(RunDir(tmp_path / "runs" / "a_s0"))
    assert phases["start-up (interpreter, imports)"] == 4.0
    assert phases["steps: rollout"] == 2.0 and phases["steps: update"] == 4.0
    assert phases["steps: other (metrics, reference)"] == pytest.approx(1.0)  # 8 - 7
    assert phases["set-up, checkpoints, MLflow"] == pytest.approx(2.0)  # 10 - 8
    assert sum(phases.values()) == pytest.approx(4.0 + 10.0 + 3.0)


def test_the_table_sums_runs_and_gives_the_rest_of_the_jobs_wall_time(tmp_path):
    _run(tmp_path, "a_s0", 4.0, 10.0, 3.0, [STEP, STEP])
    _run(tmp_path, "a_s1", 0.0, 9.0, 3.0, [STEP, STEP])  # a later run of the same job
    table, runs = phase_table(tmp_path, train_wall_s=30.0)
    assert runs == 2
    assert table.loc["start-up (interpreter, imports)", "seconds"] == 4.0
    assert table.loc["the rest of the job (exit, logs)", "seconds"] == pytest.approx(1.0)
    assert table["share"].sum() == pytest.approx(1.0)


def test_a_sweep_without_job_times_names_what_to_do(tmp_path):
    (tmp_path / "runs").mkdir()
    with pytest.raises(SystemExit, match="no runs/\\*/job_times.json"):
        phase_table(tmp_path, train_wall_s=1.0)
