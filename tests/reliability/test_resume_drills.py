"""Drills: a crash, a preemption or a rerun leaves the trainer able to continue, and what it
says about it is true."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import yaml

from trainer.config import parse_run_config
from trainer.loop import train
from trainer.tracking import MetricsFile


def _cfg(tmp_path: Path, model: Path, **sections):
    data = {
        "run_id": "r", "out_dir": str(tmp_path / "runs" / "r"), "seed": 0,
        "model": {"path": str(model), "device": "cpu"},
        "rollout": {"n": 2, "prompts_per_step": 2, "max_new_tokens": 16, "overlong_buffer": 4},
        "optim": {"steps": 3}, "tracking": {"mlflow_uri": None, "progress": False},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return parse_run_config(data, "drill")


def _steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_torn_metrics_line_is_dropped_on_resume(tmp_path, tiny_model):
    """A crash mid-write leaves half a JSON line; every rerun used to die on it with
    JSONDecodeError until the file was edited by hand."""
    cut = _cfg(tmp_path, tiny_model, debug={"stop_after_steps": 2})
    run = train(cut)
    assert _steps(run) == [1, 2] and (run / "state" / "resume.pt").exists()
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "reward_mean": 0.')  # the crash: no closing brace, no newline
    with pytest.warns(UserWarning, match="dropped line 3"):
        train(_cfg(tmp_path, tiny_model))
    assert _steps(run) == [1, 2, 3] and (run / "DONE").exists()


def test_metrics_file_keeps_good_lines_around_a_torn_one(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "x"')
    with pytest.warns(UserWarning, match="cut short by a crash"):
        f = MetricsFile(path, resume_step=2)
    f.write({"step": 3})
    f.close()
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2, 3]


def test_rerun_without_state_does_not_claim_a_state(tmp_path, tiny_model):
    """An attempt that died before its first resume state left config.yaml: the rerun used to
    warn that "the saved state still sets weights, optimizer, RNG..." although there was none;
    and a new parent run id (every `snakemake` invocation has one) is not a config change."""
    cfg = _cfg(tmp_path, tiny_model, optim={"steps": 1})
    run = Path(cfg.out_dir)
    run.mkdir(parents=True)
    saved = cfg.model_dump(mode="json")
    saved["optim"]["lr"] = 1e-3
    saved["tracking"]["parent_run_id"] = "an-older-invocation"
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(cfg)
    said = [str(w.message) for w in caught if "differs from the saved one" in str(w.message)]
    assert len(said) == 1 and "['optim.lr']" in said[0], said
    assert "no resume state" in said[0] and "saved state still sets" not in said[0]


def test_sigterm_says_where_it_stopped_and_done_leaves_no_empty_state_dir(tmp_path, tiny_model):
    cfg = _cfg(tmp_path, tiny_model, optim={"steps": 400})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    run = Path(cfg.out_dir)
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "--config", str(path)],
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not ((run / "metrics.jsonl").exists() and len(_steps(run)) >= 2):
        assert time.monotonic() < deadline and proc.poll() is None, "training never reached step 2"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=60)
    assert proc.returncode == 75
    step = len(_steps(run))
    assert f"preempted (SIGTERM) at step {step}, state saved, rerun to resume" in stdout
    # resume to the end: the state file is removed, and so is its (now empty) folder
    train(_cfg(tmp_path, tiny_model, optim={"steps": step + 1}))
    assert (run / "DONE").exists() and not (run / "state").exists()


def test_a_signal_inside_the_checkpoint_write_still_leaves_the_state_it_reports(tmp_path,
                                                                                tiny_model):
    """SIGTERM sent from inside step 2's HF checkpoint write (debug.signal_in_checkpoint):
    the step's preemption was decided before the save, so step 3 runs, saves its state and
    only then says "preempted ... state saved". The flag used to be read twice (once for the
    save, once for the exit), so this signal skipped the save and still exited 75 with
    "state saved" and no state."""
    cfg = _cfg(tmp_path, tiny_model, optim={"steps": 6}, checkpoint={"eval_steps": [2]},
               debug={"signal_in_checkpoint": 2})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    run = Path(cfg.out_dir)
    proc = subprocess.run([sys.executable, "-m", "trainer", "--config", str(path)],
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}, text=True,
                          capture_output=True, timeout=300)
    assert proc.returncode == 75, proc.stderr[-3000:]
    assert "preempted (SIGTERM) at step 3, state saved, rerun to resume" in proc.stdout
    assert (run / "state" / "resume.pt").exists() and _steps(run) == [1, 2, 3]
    assert (run / "checkpoints" / "step_2" / "model.safetensors").exists()
    data = yaml.safe_load(path.read_text())
    data["debug"]["signal_in_checkpoint"] = None
    path.write_text(yaml.safe_dump(data))
    rerun = subprocess.run([sys.executable, "-m", "trainer", "--config", str(path)],
                           capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "resuming" in rerun.stdout and "at step 3" in rerun.stdout
    assert _steps(run) == [1, 2, 3, 4, 5, 6] and (run / "DONE").exists()
