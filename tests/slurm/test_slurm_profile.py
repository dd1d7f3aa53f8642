"""The shipped SLURM profile on a real one-node SLURM: the drills a cluster inflicts on a
sweep, each ending with the sweep complete (report written) and `metrics.jsonl` holding
exactly one line per step.

    (a) a training job nears its time limit (cut short while it runs): the profile's
        warning signal reaches the trainer, it saves and exits 75, Snakemake's retry
        resumes it;
    (b) `scontrol requeue` of a running training job: SLURM runs it again, it resumes;
    (c) `scancel` of a running training job (in a run that does not retry), then the
        user's rerun, with the shipped profile as is, resumes it and finishes the sweep;
    (d) an evaluation job killed while running leaves no summary; the retry writes it.

The user's rerun in (c) is the shipped profile with only its placeholders filled in,
taking the micro sweep to its report; the test then reads the sweep's resources (CPUs,
memory, time limit and a GPU: the cluster has one stand-in) back from SLURM's record of
the train job. Killing an evaluation exactly inside its final write would need a pause
hook in eval; (d) kills it while it samples, so what it checks is that a killed job leaves
no summary behind, not where the kill lands.

The two sweeps run at the same time (each needs one of the node's CPUs at a time): the
time-limit sweep starts in a fixture, the other drills run while it waits for SLURM.
"""

import json
import math
import re
import subprocess
import sys
import threading

import pytest
from slurm_workflow import (
    Workflow,
    metrics_steps,
    micro_sweep,
    profile_overlay,
    submitted_jobs,
    wait_for,
)

pytestmark = pytest.mark.slow

RUN = "rpg-reinforce-urkl_s0"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """The tiny model, built here (not a cluster job: a real sweep names an HF model)."""
    out = tmp_path_factory.mktemp("model") / "tiny"
    subprocess.run([sys.executable, "-m", "trainer", "tiny", "--out", str(out),
                    "--sft-steps", "10"], check=True, capture_output=True, timeout=300)
    return str(out)


@pytest.fixture(scope="module")
def time_limit_run(slurm, model, tmp_path_factory):
    """(a) started in the background, with the profile as shipped (warning 300 s before).

    At step 2 a helper thread shortens the running job's limit (`scontrol update
    TimeLimit=`, whole minutes) to end 4-5 minutes from now, so the shipped warning falls
    due at SLURM's next time-limit check (every 30 s). The trainer still has steps to go
    then (80 steps of at least 1 s each, `debug.sleep_per_step_s`, however fast the machine); the retry has a 20-minute limit.
    """
    root = tmp_path_factory.mktemp("timelimit")
    steps = 80
    config = micro_sweep(root, "timelimit", model=model, steps=steps, step_seconds=1.0)
    wf = Workflow(slurm, root, config, profile_overlay(root / "profile"))
    proc = wf.start()
    shortened: dict = {}

    def shorten_limit():
        try:
            wait_for(lambda: len(metrics_steps(wf.run_dir(RUN))) >= 2, "step 2", 300, proc)
            job = wait_for(lambda: wf.job("train", RUN), "the train job", 30, proc)
            elapsed = slurm.run("squeue", "-h", "-j", job, "-o", "%M").stdout.strip()
            minutes = _minutes(elapsed) + 4
            slurm.run("scontrol", "update", f"JobId={job}", f"TimeLimit={minutes}")
            shortened["at_step"] = len(metrics_steps(wf.run_dir(RUN)))
        except Exception as e:  # reported by the test
            shortened["error"] = repr(e)

    thread = threading.Thread(target=shorten_limit, daemon=True)
    thread.start()
    yield wf, proc, steps, thread, shortened
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=60)


def _minutes(elapsed: str) -> int:
    """squeue's elapsed time ("M:SS", "H:MM:SS") in whole minutes, rounded up."""
    parts = [int(x) for x in elapsed.split(":")]
    seconds = sum(v * 60 ** i for i, v in enumerate(reversed(parts)))
    return math.ceil(seconds / 60)


def test_requeue_scancel_killed_evaluation_and_the_users_rerun(slurm, model, time_limit_run,
                                                               tmp_path):
    steps = 12
    # At least 1 s a step, however fast the machine: the drills below act between steps and
    # must find steps still to go (a fresh machine ran the 10 resumed steps in 6 s).
    config = micro_sweep(tmp_path, "drills", model=model, steps=steps, train_gpus=1,
                         eval_limit=32, step_seconds=1.0)
    wf = Workflow(slurm, tmp_path, config, profile_overlay(tmp_path / "profile"))
    run_dir = wf.run_dir(RUN)
    # A run that does not retry, so that the cancelled job stays failed until the user reruns.
    proc = wf.start("--retries", "0")
    try:
        # (b) requeue at step 2; SLURM starts the same job again and the trainer resumes
        wait_for(lambda: len(metrics_steps(run_dir)) >= 2, "step 2", 240, proc)
        job = wait_for(lambda: wf.job("train", RUN), "the running train job", 30, proc)
        slurm.run("scontrol", "requeue", job)
        wait_for(lambda: wf.job("train", RUN, states=("PENDING",)), "requeued", 60, proc)
        # A requeued job waits (Reason=BeginTime) before SLURM starts it again; start it now.
        slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now")
        wait_for(lambda: "resuming" in _train_log(wf), "the requeued trainer to resume", 120, proc)
        # (c) scancel two steps later
        resumed_at = len(metrics_steps(run_dir))
        wait_for(lambda: len(metrics_steps(run_dir)) >= resumed_at + 2, "two more steps", 120,
                 proc)
        slurm.run("scancel", job)
        assert proc.wait(timeout=300) != 0
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
    stopped = metrics_steps(run_dir)
    assert stopped == list(range(1, len(stopped) + 1)) and len(stopped) < steps
    assert not (run_dir / "DONE").exists()
    # the trainer got scancel's SIGTERM, saved its state and exited 75 (not killed)
    assert (run_dir / "state" / "resume.pt").exists()
    assert "non-zero exit status 75" in wf.slurm_logs("train"), wf.slurm_logs("train")

    # The user's rerun, with the shipped profile as is; (d) its evaluation job is killed.
    rerun = wf.start()
    summary = run_dir / f"eval/step_{steps}/toy.json"
    try:
        eval_job = wait_for(lambda: wf.job("evaluate_run", RUN), "the evaluation job", 300,
                            rerun)
        wait_for(lambda: (wf.out / f"logs/eval/{RUN}/all.log").exists(),
                 "the evaluation to start", 60, rerun)
        slurm.run("scancel", eval_job)
        wait_for(lambda: not wf.job("evaluate_run", RUN, states=("RUNNING", "COMPLETING")),
                 "the evaluation job to end", 60, rerun)
        assert not summary.exists()
        assert rerun.wait(timeout=300) == 0, (tmp_path / "snakemake.out").read_text()
    finally:
        if rerun.poll() is None:
            rerun.terminate()
            rerun.wait(timeout=60)
    out = (tmp_path / "snakemake.out").read_text()
    assert len(submitted_jobs(out, "evaluate_run")) == 2  # killed, then retried
    assert metrics_steps(run_dir) == list(range(1, steps + 1))
    assert json.loads(summary.read_text())["num_problems"] == 32
    assert (wf.out / "report.md").exists()
    # the sweep's resources (their one owner) reached SLURM unchanged
    job = slurm.run("scontrol", "show", "job", submitted_jobs(out, "train")[-1]).stdout
    assert "NumCPUs=1 " in job and "MinMemoryNode=2000M" in job
    assert "TimeLimit=00:10:00" in job and "Partition=debug" in job
    assert re.search(r"TresPerJob=gres[:/]gpu:1\b", job), job


def _train_log(wf) -> str:
    path = wf.out / f"logs/train/{RUN}.log"
    return path.read_text() if path.exists() else ""


def test_time_limit_warning_makes_the_trainer_save_and_the_retry_resume(time_limit_run):
    wf, proc, steps, thread, shortened = time_limit_run
    assert proc.wait(timeout=900) == 0, (wf.root / "snakemake.out").read_text()
    thread.join(timeout=10)
    assert "at_step" in shortened, shortened
    assert metrics_steps(wf.run_dir(RUN)) == list(range(1, steps + 1))
    assert (wf.out / "report.md").exists()
    # the first attempt ended with the trainer's own "saved, try again" code, not a kill
    out = (wf.root / "snakemake.out").read_text()
    assert len(submitted_jobs(out, "train")) == 2, out
    assert "non-zero exit status 75" in wf.slurm_logs("train"), wf.slurm_logs("train")
    assert "resuming" in _train_log(wf)
