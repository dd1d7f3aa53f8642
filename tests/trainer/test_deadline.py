"""The trainer stops before a step that would end past the job's deadline."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import yaml

from trainer.checkpoint import PREEMPTED_EXIT_CODE
from trainer.deadline import Deadline, job_deadline, parse_deadline


def test_must_stop_counts_the_longest_step_the_save_and_the_margin():
    clock = Deadline(end=1000.0, margin_s=10.0)
    assert not clock.must_stop(now=989.0)  # nothing measured yet: only the margin
    assert clock.must_stop(now=990.5)
    clock.record_step(30.0)
    clock.record_step(20.0)  # the longest step counts
    clock.record_save(5.0)
    assert not clock.must_stop(now=954.0)  # 954 + 30 + 5 + 10 = 999
    assert clock.must_stop(now=956.0)
    assert not Deadline(end=None).must_stop(now=1e12)


def test_deadline_sources(monkeypatch):
    assert parse_deadline("1700000000") == 1700000000.0
    assert parse_deadline("2026-12-01T02:00:00+00:00") == 1796090400.0
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_deadline("tomorrow")
    monkeypatch.setenv("SLURM_JOB_END_TIME", "1700000123")
    assert job_deadline(None) == 1700000123.0
    assert job_deadline("5") == 5.0  # the command line wins


def test_a_run_whose_next_step_would_miss_the_deadline_saves_and_exits_75(make_cfg, tmp_path):
    # 400 steps of at least 0.5 s each (debug.sleep_per_step_s) cannot end before the
    # deadline below, however fast the machine.
    cfg = make_cfg("dl", optim={"steps": 400}, checkpoint={"deadline_margin_s": 0.0},
                   debug={"sleep_per_step_s": 0.5})
    path = tmp_path / "dl.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    run = [sys.executable, "-m", "trainer", "--config", str(path)]
    # Ends after the first step has been measured: some steps run, then the trainer stops
    # with a state (the margin-free rule: now + longest step > deadline).
    proc = subprocess.run([*run, "--deadline", str(time.time() + 20)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == PREEMPTED_EXIT_CODE, proc.stderr[-2000:]
    assert "would end past the deadline" in proc.stdout
    out = tmp_path / "runs" / "dl"
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert 1 <= len(steps) < 400 and (out / "state" / "resume.pt").exists()
    proc = subprocess.run([*run, "--deadline", "not-a-time"], capture_output=True, text=True)
    assert proc.returncode == 2 and "ISO 8601" in proc.stderr
