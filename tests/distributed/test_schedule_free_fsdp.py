"""Schedule-free AdamW under FSDP2 (2 gloo processes): its eval()/train() switch works on
sharded parameters around the gathered HF checkpoint. (The resume state goes through the
same torch.distributed.checkpoint calls at any world size; tests/trainer/test_schedule_free.py
checks that a resume is exact. One run here: each torchrun start costs ~25 s on 2 cores.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

TORCHRUN = [sys.executable, "-m", "trainer.launch", "--standalone", "--nproc-per-node", "2"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
TIMING = {"time_rollout", "time_logprob", "time_update", "time_step", "tokens_per_sec"}


def _run(tmp_path: Path, name: str, tiny_dir: Path) -> Path:
    out = tmp_path / "runs" / name
    cfg = {"run_id": name, "out_dir": str(out), "seed": 0,
           "model": {"path": str(tiny_dir), "device": "cpu"},
           "rollout": {"n": 4, "prompts_per_step": 4, "max_new_tokens": 16,
                       "overlong_buffer": 4, "dynamic_sampling": False},
           "optim": {"steps": 2, "lr": 1e-2, "optimizer": "schedule_free_adamw"},
           "checkpoint": {"eval_steps": [1, 2]},
           "tracking": {"mlflow_uri": None, "progress": False}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([*TORCHRUN, "-m", "trainer", "--config", str(path)], env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _untimed(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def test_two_process_schedule_free_run_writes_its_average_weights(tiny_dir, tmp_path):
    out = _run(tmp_path, "ws2", tiny_dir)
    assert (out / "DONE").exists() and [r["step"] for r in _untimed(out)] == [1, 2]
    one = load_file(out / "checkpoints" / "step_1" / "model.safetensors")
    two = load_file(out / "checkpoints" / "step_2" / "model.safetensors")
    assert one.keys() == two.keys()
    assert all(torch.isfinite(v).all() for v in two.values())
    assert max(float((one[k] - two[k]).abs().max()) for k in one) > 1e-4  # x moved
