"""Drills: every bad input a user can type is an error before the first job (through
`snakemake -n`) or before the trainer writes anything, on one line naming the file, the key
and the fix, with no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import yaml
from reliability_helpers import closed_port, micro_sweep, snakemake

# (what the user wrote, the key the error must name, text of the fix or the allowed values)
BAD_SWEEPS = {
    "unknown benchmark": ({"eval": {"benchmarks": ["toy", "aime42"]}}, "eval.benchmarks",
                          "aime24"),
    "missing eval file": ({"eval": {"benchmarks": ["toy", "aime24"],
                                    "files": {"aime24": "/nonexistent/aime24.jsonl"}}},
                          "eval.files.aime24", "does not exist"),
    "model path typo": ({"base": {"model": {"path": "results/defualt/modle"}}},
                        "base.model.path", "neither an existing directory nor a hub id"),
    "negative beta": ({"axes": {"beta": [-1e-4, 1e-4]}}, "axes.beta[0]", "greater than or equal"),
    "typo inside base": ({"base": {"rollout": {"temprature": 0.7}}}, "rollout.temprature",
                         "Extra inputs are not permitted"),
    "limit for an unlisted benchmark": ({"eval": {"limit": {"amc23": 2}}}, "eval.limit",
                                        "amc23"),
}


@pytest.mark.parametrize("case", list(BAD_SWEEPS))
def test_bad_sweep_input_fails_the_dry_run(case, tmp_path, tiny_model):
    change, key, fix = BAD_SWEEPS[case]
    base = yaml.safe_load(micro_sweep(tmp_path, tiny_model).read_text())
    for section, value in change.items():
        if section == "base":  # deep enough for these cases
            for sub, inner in value.items():
                base["base"][sub] = {**base["base"].get(sub, {}), **inner}
        elif section == "eval":
            base["eval"] = {**base["eval"], **value}
        else:
            base[section] = value
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(base))
    proc = snakemake("-n", "-c", "1", "--configfile", str(config), cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    lines = [line for line in out.splitlines() if key in line]
    assert lines and str(config) in out, out
    assert any(fix in line for line in lines + out.splitlines()), out
    assert "Traceback" not in out and "InputFunctionException" not in out, out
    assert not (tmp_path / "results").exists()  # nothing written


def test_good_micro_sweep_passes_the_dry_run(tmp_path, tiny_model):
    """The control: the drills above fail because of their one change."""
    proc = snakemake("-n", "-c", "1", "--configfile", str(micro_sweep(tmp_path, tiny_model)),
                     cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _trainer(config, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", "--config", str(config)], text=True,
                          capture_output=True, env={**os.environ, **(env or {})},
                          timeout=timeout)


@pytest.mark.parametrize("path, needle", [
    ("", "model.path is required"),
    ("/nonexistent/model", "neither an existing directory nor a hub id"),
    ("Qwen/Qwen3-4B-typo", "hub cannot be reached"),
])
def test_trainer_rejects_a_bad_model_path_in_seconds(path, needle, tmp_path):
    """rc 2, one line naming the file and the key, no run directory; a hub-like typo costs
    one request to the (here unreachable) hub instead of ~50 s of retries."""
    out_dir = tmp_path / "runs" / "r"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"run_id": "r", "out_dir": str(out_dir),
                                      "model": {"path": path},
                                      "tracking": {"mlflow_uri": None}}))
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}", "HF_HUB_CACHE": str(tmp_path),
           "HF_HUB_OFFLINE": "0"}
    t0 = time.monotonic()
    proc = _trainer(config, env)
    assert time.monotonic() - t0 < 40
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and str(config) in err[0] and "model.path" in err[0], proc.stderr
    assert needle in err[0]
    assert not out_dir.exists()
