"""Drills: a checkpoint that an engine or the trainer cannot load (weights cut short, weights
of another shape, no config.json, no tokenizer) is one line naming the file, what is wrong
and the fix, exit code 2, before any weights load: `python -m eval` and `python -m trainer`
as a user runs them, on a damaged copy of the shipped tiny model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from reliability_helpers import REPO

SHIPPED = REPO / "data" / "tiny-model"


def _truncate(model: Path) -> Path:
    weights = model / "model.safetensors"
    with weights.open("r+b") as f:
        f.truncate(weights.stat().st_size // 2)  # a save or copy cut short
    return weights


def _other_shapes(model: Path) -> Path:
    config = json.loads((model / "config.json").read_text())
    config["intermediate_size"] *= 2  # the weights no longer fit the config
    (model / "config.json").write_text(json.dumps(config))
    return model / "model.safetensors"


def _no_config(model: Path) -> Path:
    (model / "config.json").unlink()
    return model


def _no_tokenizer(model: Path) -> Path:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).unlink()
    return model


# damage -> (the file the line must name, what it must say is wrong)
DAMAGE = {
    "truncated weights": (_truncate, "is not a complete safetensors file"),
    "weights of another shape": (_other_shapes, "has shape"),
    "no config.json": (_no_config, "has no config.json"),
    "no tokenizer": (_no_tokenizer, "has no tokenizer"),
}


def _damaged(tmp_path: Path, case: str) -> tuple[Path, Path, str]:
    model = tmp_path / "model"
    shutil.copytree(SHIPPED, model)
    damage, wrong = DAMAGE[case]
    return model, damage(model), wrong


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=300)


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


@pytest.mark.parametrize("case", list(DAMAGE))
def test_eval_on_an_unloadable_checkpoint_is_one_line(case, tmp_path):
    model, named, wrong = _damaged(tmp_path, case)
    out = tmp_path / "eval"
    proc = _run("eval", "--checkpoint", str(model), "--benchmark", "toy", "--limit", "2",
                "--n", "1", "--out", str(out), "--no-progress", cwd=tmp_path)
    line = _one_error_line(proc)
    assert proc.stderr.strip() == line  # nothing but the line
    assert str(named) in line and wrong in line, line
    assert not out.exists()  # refused before anything was written


@pytest.mark.parametrize("case", ["truncated weights", "weights of another shape"])
def test_trainer_on_an_unloadable_model_is_one_line(case, tmp_path):
    model, named, wrong = _damaged(tmp_path, case)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "run_id": "r", "out_dir": str(tmp_path / "runs" / "r"), "seed": 0,
        "model": {"path": str(model), "device": "cpu"}, "optim": {"steps": 1},
        "tracking": {"mlflow_uri": None, "progress": False}}))
    proc = _run("trainer", "--config", str(config), cwd=tmp_path)
    line = _one_error_line(proc)
    assert str(config) in line and "model.path" in line, line
    assert str(named) in line and wrong in line, line
    assert not (tmp_path / "runs").exists()
