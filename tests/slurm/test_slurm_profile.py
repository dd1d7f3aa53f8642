"""The shipped SLURM profile on a real one-node SLURM: the drills a cluster inflicts on a
sweep, each ending with the sweep complete (report written) and `metrics.jsonl` holding
exactly one line per step.

    (a) a training job reaches its time limit: the warning signal reaches the trainer, it
        saves and exits 75, Snakemake's retry resumes it;
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
    """(a) started in the background: limit 2 min (4, 6 on retries), warning 50 s before.

    SLURM checks time limits every 30 s and sends the warning at the first check less than
    lead + 30 s before the limit: here 40-70 s into the job, after the trainer has started
    even on a busy machine (a warning during start-up kills the job before anything could
    save). The run holds ~140 s of steps at this machine's speed (measured on a short run):
    it outlives the first warning even if the jobs run twice as fast as measured, and the
    retries (warned at 160-190 s and 280-310 s) finish it even if they run twice as slow.
    """
    root = tmp_path_factory.mktemp("timelimit")
    probe = subprocess.run([sys.executable, "-c", _STEP_TIME, model], check=True,
                           capture_output=True, text=True, timeout=300)
    steps = min(500, max(12, math.ceil(140 / float(probe.stdout.split()[-1]))))
    config = micro_sweep(root, "timelimit", model=model, steps=steps, train_min=2)
    wf = Workflow(slurm, root, config, profile_overlay(root / "profile", lead_s=50))
    proc = wf.start()
    yield wf, proc, steps
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=60)


# seconds per training step of the micro sweep's settings on this machine (the median of
# steps 2-5 of a local run; step 1 pays for warm-up)
_STEP_TIME = """
import sys, tempfile, time
from trainer.config import parse_run_config
from trainer.loop import train
out = tempfile.mkdtemp()
cfg = parse_run_config({"model": {"path": sys.argv[1]}, "out_dir": out,
    "task": {"kind": "toy", "num_prompts": 64}, "optim": {"steps": 5},
    "rollout": {"n": 4, "prompts_per_step": 4, "max_new_tokens": 24},
    "tracking": {"mlflow_uri": None, "progress": False}})
train(cfg)
import json, statistics
lines = open(out + "/metrics.jsonl").read().splitlines()
print(statistics.median(json.loads(x)["time_step"] for x in lines[1:]))
"""


def test_requeue_scancel_killed_evaluation_and_the_users_rerun(slurm, model, time_limit_run,
                                                               tmp_path):
    steps = 12
    config = micro_sweep(tmp_path, "drills", model=model, steps=steps, train_gpus=1,
                         eval_limit=32)
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
        eval_job = wait_for(lambda: wf.job("evaluate", RUN), "the evaluation job", 300,
                            rerun)
        wait_for(lambda: (wf.out / f"logs/eval/{RUN}/step_{steps}_toy.log").exists(),
                 "the evaluation to start", 60, rerun)
        slurm.run("scancel", eval_job)
        wait_for(lambda: not wf.job("evaluate", RUN, states=("RUNNING", "COMPLETING")),
                 "the evaluation job to end", 60, rerun)
        assert not summary.exists()
        assert rerun.wait(timeout=300) == 0, (tmp_path / "snakemake.out").read_text()
    finally:
        if rerun.poll() is None:
            rerun.terminate()
            rerun.wait(timeout=60)
    out = (tmp_path / "snakemake.out").read_text()
    assert len(submitted_jobs(out, "evaluate")) == 2  # killed, then retried
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
    wf, proc, steps = time_limit_run
    assert proc.wait(timeout=600) == 0, (wf.root / "snakemake.out").read_text()
    assert metrics_steps(wf.run_dir(RUN)) == list(range(1, steps + 1))
    assert (wf.out / "report.md").exists()
    # the first attempt ended with the trainer's own "saved, try again" code, not a kill
    out = (wf.root / "snakemake.out").read_text()
    assert len(submitted_jobs(out, "train")) >= 2, out
    assert "non-zero exit status 75" in wf.slurm_logs("train"), wf.slurm_logs("train")
    assert "resuming" in _train_log(wf)
