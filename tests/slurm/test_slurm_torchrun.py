"""A multi-node train job's launch, for real on the one-node cluster: the command the train
rule runs when `resources.train.nodes > 1` (srun, one launcher per node, the torchrun
rendezvous read from SLURM's environment) trains the tiny model with 2 ranks per node."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import yaml
from slurm_cluster import _which

from sweep.runconfig import train_command
from sweep.spec import parse_sweep
from trainer.tiny import TinyConfig, build_tiny

TINY = TinyConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                  sft_steps=20, sft_batch_size=16, sft_lr=5e-3)


def test_srun_launch_trains_with_the_rendezvous_from_slurm(slurm, tmp_path):
    model = build_tiny(tmp_path / "model", TINY, progress=False)
    out = tmp_path / "run"
    cfg = {"run_id": "srun", "out_dir": str(out), "model": {"path": str(model), "device": "cpu"},
           "rollout": {"n": 4, "prompts_per_step": 4, "max_new_tokens": 16,
                       "overlong_buffer": 4, "dynamic_sampling": False},
           "optim": {"steps": 2, "lr": 1e-3},
           "tracking": {"mlflow_uri": None, "progress": False}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    sweep = parse_sweep({"name": "t", "base": {}, "methods": ["DAPO"], "eval": {
        "steps": [2], "benchmarks": ["toy"]},
        "resources": {"train": {"gpus": 2, "nodes": 2}}})
    command = train_command(sweep)  # what the train rule runs; this cluster has one node
    assert command.startswith("srun ") and "--slurm" in command
    command = command.replace("python", shlex.quote(sys.executable), 1)
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\nexport OMP_NUM_THREADS=1\n"
                      f"exec {command} --config {tmp_path / 'run.yaml'}\n")
    job = subprocess.run(
        [_which("sbatch"), "--wait", "--nodes=1", "--ntasks=1",
         "--cpus-per-task=1", f"--output={tmp_path / 'job.log'}", str(script)],
        env=slurm.env, capture_output=True, text=True, timeout=600)
    log = (tmp_path / "job.log").read_text() if (tmp_path / "job.log").exists() else ""
    assert job.returncode == 0, f"{job.stderr}\n{log[-3000:]}\n{slurm.logs()}"
    assert "[trainer.launch] node 0 of 1: rendezvous" in log
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]  # rank 0 alone wrote, once per step
    assert (out / "DONE").exists()


def test_first_host_of_a_slurm_hostlist():
    from trainer.launch import first_host

    cases = {"gpu[07-09,12],cpu1": "gpu07", "vm": "vm", "a1,b2": "a1", "node[001]": "node001",
             "n[3,5-6]": "n3", "rack1-n[10-11]": "rack1-n10"}
    assert {nodelist: first_host(nodelist) for nodelist in cases} == cases
