"""The MLflow UI opens on the sweep's training runs: experiments carry MLflow 3's
`mlflow.experimentKind` tag, the parent run spans the invocation, and a real `mlflow ui`
rendered in headless Chromium shows the child runs by name."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from common.tracking import (
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    RUNS_PAGE,
    client,
    ensure_experiment,
)
from sweep import load_sweep
from sweep.tracking import end_parent_run, start_parent_run


def _sweep(tmp_path: Path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "s", "results_dir": str(tmp_path / "results"), "methods": ["GRPO"],
        "eval": {"steps": [2], "benchmarks": ["toy"]}}))
    return load_sweep(path)


def test_experiment_is_tagged_and_parent_run_spans_the_invocation(tmp_path):
    sweep = _sweep(tmp_path)
    run_id = start_parent_run(sweep, tmp_path / "parent")
    c = client(sweep.mlflow_uri)
    assert c.get_run(run_id).info.status == "RUNNING"
    time.sleep(0.5)  # the sweep's jobs
    end_parent_run(sweep, tmp_path / "parent", ok=True)
    info = c.get_run(run_id).info
    assert info.status == "FINISHED" and info.end_time - info.start_time >= 500
    exp = c.get_experiment(info.experiment_id)
    assert exp.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND == "custom_model_development"


def test_failed_invocation_fails_the_parent_and_old_experiments_get_the_tag(tmp_path):
    sweep = _sweep(tmp_path)
    c = client(sweep.mlflow_uri)
    old = c.create_experiment(sweep.experiment)  # made before the tag existed
    assert ensure_experiment(c, sweep.experiment, sweep.mlflow_uri) == old
    assert c.get_experiment(old).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    run_id = start_parent_run(sweep, tmp_path / "parent")
    end_parent_run(sweep, tmp_path / "parent", ok=False)
    assert c.get_run(run_id).info.status == "FAILED"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_mlflow_ui_in_a_browser_opens_on_the_runs_table(tmp_path):
    """`mlflow ui` on loopback for a store written by the sweep's tracking code (a parent run
    and two nested children); Chromium renders the link docs/mlflow.md gives and the runs
    table holds the parent and its children. .ci/run installs Debian's chromium."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium not found: `apt-get install -y chromium` (tools/test.sh does)"
    sweep = _sweep(tmp_path)
    parent = start_parent_run(sweep, tmp_path / "parent")
    c = client(sweep.mlflow_uri)
    exp_id = c.get_run(parent).info.experiment_id
    for name in ("grpo_s0", "rpg-urkl_s1"):
        child = c.create_run(exp_id, run_name=name, tags={"mlflow.parentRunId": parent})
        c.set_terminated(child.info.run_id)
    end_parent_run(sweep, tmp_path / "parent", ok=True)

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("mlflow")), "ui", "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1", "--backend-store-uri", sweep.mlflow_uri],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail("mlflow ui did not start within 90 s")
                time.sleep(0.5)
        dom = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--user-data-dir={tmp_path / 'chromium'}", "--virtual-time-budget=30000",
             "--dump-dom", f"{url}/{RUNS_PAGE.format(experiment_id=exp_id)}"],
            capture_output=True, text=True, timeout=120, check=True).stdout
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    # MLflow 3.17 lists children collapsed under their parent (their names appear only once
    # expanded, a click --dump-dom cannot make): the parent is shown, the children counted.
    text = " ".join(re.sub(r"<[^>]+>", " ", re.sub(r"<(style|script)\b.*?</\1>", " ", dom,
                                                 flags=re.S)).split())
    assert "Run Name" in text and "s sweep" in text, "the runs table is not the page opened"
    assert "3 matching runs" in text, "the two child runs are not in the runs table"
