"""Drill: the disk fills while the trainer saves its resume state, on a real small tmpfs.
The trainer says so in one line (the path, the bytes needed, the bytes free) and exits 74;
the previous state stays whole, and after space is freed the rerun resumes from it and ends
exactly where an uninterrupted run ends."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from reliability_helpers import REPO
from safetensors.torch import load_file

from trainer.checkpoint import DISK_FULL_EXIT_CODE
from trainer.config import parse_run_config
from trainer.loop import train

SHIPPED = REPO / "data" / "tiny-model"
TIMING = {"time_rollout", "time_logprob", "time_update", "time_step", "tokens_per_sec"}


def _mount(*args: str) -> subprocess.CompletedProcess:
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    return subprocess.run([*sudo, "mount", *args], capture_output=True, text=True)


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs that holds one resume state of the shipped tiny model but not two (a state is
    its weights and AdamW's two moments, about 3x the weights): the second save fills it."""
    disk = tmp_path / "disk"
    disk.mkdir()
    weights = (SHIPPED / "model.safetensors").stat().st_size
    size_kib = int(4.5 * weights) // 1024
    proc = _mount("-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(disk))
    if proc.returncode != 0:  # not a skip: the drill needs a real full filesystem
        pytest.fail(f"cannot mount a {size_kib} KiB tmpfs at {disk} ({proc.stderr.strip()}): "
                    "this drill needs root or passwordless sudo for `mount -t tmpfs`")
    try:
        yield disk
    finally:
        subprocess.run([*([] if os.geteuid() == 0 else ["sudo", "-n"]), "umount", str(disk)],
                       check=True)


def _config(out_dir: Path) -> dict:
    return {
        "run_id": "r", "out_dir": str(out_dir), "seed": 0,
        "model": {"path": str(SHIPPED), "device": "cpu"},
        "rollout": {"n": 2, "prompts_per_step": 2, "max_new_tokens": 16, "overlong_buffer": 4},
        "optim": {"steps": 3}, "checkpoint": {"state_every_steps": 1},
        "tracking": {"mlflow_uri": None, "progress": False},
    }


def _untimed(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def test_full_disk_while_saving_the_state_is_one_line_and_the_rerun_resumes(small_disk,
                                                                            tmp_path):
    run = small_disk / "runs" / "r"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(_config(run)))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "trainer", "--config", str(config)],
                          cwd=tmp_path, env=env, text=True, capture_output=True, timeout=600)
    assert proc.returncode == DISK_FULL_EXIT_CODE, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    line = errors[0]
    assert f"{run / 'state' / 'tensors_step_2'}: the disk is full" in line, line
    needed, free = (int(x.replace(",", "")) for x in
                    (line.split("needs about ")[1].split(" bytes")[0],
                     line.split(" bytes, ")[1].split(" are free")[0]))
    weights = (SHIPPED / "model.safetensors").stat().st_size
    assert needed >= 3 * weights and free < needed, line
    assert "previous resume state" in line and "tensors_step_1" in line, line

    # the previous state is whole: its pointer and its tensors, and nothing half-written
    state = run / "state"
    assert sorted(p.name for p in state.iterdir()) == ["resume.pt", "tensors_step_1"]
    assert torch.load(state / "resume.pt", weights_only=True)["step"] == 1

    # free space, rerun: it resumes from step 1 and ends where an uninterrupted run ends
    assert _mount("-o", "remount,size=64m", str(small_disk)).returncode == 0
    train(parse_run_config(_config(run), "rerun"))
    whole = train(parse_run_config(_config(tmp_path / "whole" / "r"), "uninterrupted"))
    assert (run / "DONE").exists()
    assert _untimed(run) == _untimed(whole)
    ours, theirs = (load_file(r / "checkpoints" / "step_3" / "model.safetensors")
                    for r in (run, whole))
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    shutil.rmtree(run)  # leave the tmpfs empty for umount
