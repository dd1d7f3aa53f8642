"""Drills: MLflow that cannot be written or reached never fails a job, never stalls one for
minutes, and a later run attaches what it missed; artifacts stay with the results."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

import pytest
import yaml
from reliability_helpers import closed_port, micro_sweep, read_only, snakemake

from sweep import load_sweep
from sweep.tracking import pending_runs, start_parent_run, sync_pending
from trainer.config import parse_run_config
from trainer.loop import train


def _store(path: Path) -> str:
    """A real sqlite store with its schema created (what a first sweep leaves behind)."""
    from mlflow.tracking import MlflowClient

    path.parent.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{path}"
    MlflowClient(uri).search_experiments()
    return uri


def _runs(uri: str, experiment: str):
    import mlflow

    mlflow.set_tracking_uri(uri)
    return mlflow.search_runs(experiment_names=[experiment], output_format="pandas")


@pytest.mark.slow
def test_read_only_store_sweep_finishes_and_a_later_run_attaches_it(tmp_path, tiny_model):
    """The sqlite file is read-only (`chattr +i`): the sweep still trains, evaluates and
    reports (it used to fail every evaluation with rc 2, for good), with one warning line
    instead of a SQLAlchemy traceback. Once the file is writable, the next `snakemake`
    attaches the run (metrics and evaluation) to MLflow; the one after does nothing."""
    # no step-0 evaluation: it never talks to MLflow, so it is no part of this drill
    config = micro_sweep(tmp_path, tiny_model, eval={"initial": False})
    out = tmp_path / "results" / "micro"
    uri = _store(out / "mlflow.db")
    with read_only(out / "mlflow.db"):
        first = snakemake("-c", "2", "--configfile", str(config), cwd=tmp_path)
        log = first.stdout + first.stderr
        assert first.returncode == 0, log
        assert (out / "report.md").is_file()
        assert "sweep warning: MLflow parent run not created" in log
        assert "Traceback" not in log
        assert pending_runs(out) == [out / "runs" / "grpo_s0"]
        assert not (out / "runs" / "grpo_s0" / "mlflow_run_id").exists()
        still = snakemake("-c", "2", "--configfile", str(config), cwd=tmp_path)  # still broken
        assert still.returncode == 0 and pending_runs(out), still.stdout + still.stderr
    fixed = snakemake("-c", "2", "--configfile", str(config), cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "mlflow_sync" in fixed.stdout + fixed.stderr and pending_runs(out) == []
    runs = _runs(uri, "micro")
    child = runs[runs["tags.method"] == "GRPO"]
    assert len(child) == 1 and child["status"].iloc[0] == "FINISHED"
    assert set(child["tags.mlflow.parentRunId"]) <= set(runs[runs["tags.kind"] == "sweep"]["run_id"])
    from mlflow.tracking import MlflowClient

    c = MlflowClient(uri)
    run_id = child["run_id"].iloc[0]
    assert [m.step for m in c.get_metric_history(run_id, "reward_mean")] == [1, 2]
    assert [m.step for m in c.get_metric_history(run_id, "eval/toy/dapo/mean")] == [2]
    assert c.get_run(run_id).data.params["optim.steps"] == "2"
    again = snakemake("-c", "2", "--configfile", str(config), cwd=tmp_path)
    assert "Nothing to be done" in again.stdout + again.stderr


def _cfg(tmp_path, model, uri, run_id="r", **extra):
    return parse_run_config({
        "run_id": run_id, "out_dir": str(tmp_path / "results" / "s" / "runs" / run_id),
        "model": {"path": str(model), "device": "cpu"},
        "rollout": {"n": 2, "prompts_per_step": 2, "max_new_tokens": 16, "overlong_buffer": 4},
        "optim": {"steps": 2}, "tags": {"method": "GRPO"}, "method": {"name": "GRPO"},
        "tracking": {"mlflow_uri": uri, "experiment": "s", "progress": False}, **extra,
    }, "drill")


def test_unreachable_server_costs_seconds_and_the_sync_attaches_later(tmp_path, tiny_model):
    """A tracking server nobody answers: the parent run, the training mirror and the eval
    mirror each give up after one health probe (MLflow's own retries take ~4 min per call)
    and note the run as pending; a sync against a working store attaches it from the files."""
    dead = f"http://127.0.0.1:{closed_port()}"
    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text(yaml.safe_dump({
        "name": "s", "results_dir": str(tmp_path / "results"), "methods": ["GRPO"],
        "mlflow": {"uri": dead}, "eval": {"steps": [2], "benchmarks": ["toy"]}}))
    t0 = time.monotonic()
    messages = []
    assert start_parent_run(load_sweep(sweep_file), tmp_path / "parent", messages.append) is None
    assert "does not answer" in messages[0] and (tmp_path / "parent").read_text() == ""
    with pytest.warns(UserWarning, match="MLflow logging disabled"):
        run = train(_cfg(tmp_path, tiny_model, dead))
    assert time.monotonic() - t0 < 60
    assert (run / "DONE").exists() and not (run / "mlflow_run_id").exists()
    assert "does not answer" in (run / "mlflow_pending").read_text()
    env = {**os.environ}
    proc = subprocess.run(
        [sys.executable, "-m", "eval", "--checkpoint", str(run / "checkpoints" / "step_2"),
         "--benchmark", "toy", "--limit", "2", "--n", "1", "--max-new-tokens", "8",
         "--scorers", "dapo", "--out", str(run / "eval" / "step_2"), "--no-progress",
         "--mlflow-uri", dead, "--mlflow-run-id-file", str(run / "mlflow_run_id")],
        text=True, capture_output=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # the store works again (here: a sqlite store; the sync takes any URI)
    uri = _store(tmp_path / "results" / "s" / "mlflow.db")
    attached, failed = sync_pending(tmp_path / "results" / "s", uri, "s")
    assert attached == ["r"] and failed == [] and not (run / "mlflow_pending").exists()
    from mlflow.tracking import MlflowClient

    c = MlflowClient(uri)
    run_id = (run / "mlflow_run_id").read_text().strip()
    assert [m.step for m in c.get_metric_history(run_id, "acc_mean")] == [1, 2]
    assert [m.step for m in c.get_metric_history(run_id, "eval/toy/dapo/mean")] == [2]
    # a second sync finds nothing to do and duplicates nothing
    assert sync_pending(tmp_path / "results" / "s", uri, "s") == ([], [])
    assert len(c.get_metric_history(run_id, "acc_mean")) == 2


def test_read_only_store_warns_in_one_line(tmp_path, capfd):
    """The start-up hook used to print a 55-line SQLAlchemy traceback."""
    out = tmp_path / "results" / "s"
    _store(out / "mlflow.db")
    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text(yaml.safe_dump({
        "name": "s", "results_dir": str(tmp_path / "results"), "methods": ["GRPO"],
        "eval": {"steps": [2], "benchmarks": ["toy"]}}))
    capfd.readouterr()
    messages = []
    with read_only(out / "mlflow.db"):
        assert start_parent_run(load_sweep(sweep_file), out / "parent", messages.append) is None
    err = capfd.readouterr().err
    assert "Traceback" not in err and "SQL:" not in err, err
    assert len(messages) == 1 and "(sqlite3.OperationalError)" in messages[0]
    assert "\n" not in messages[0]


def _sweep_run_from_elsewhere(tmp_path, monkeypatch, **keys):
    """A one-method sweep under tmp_path/results, with the working directory moved to an
    unrelated folder (where a stray ./mlruns would appear). Returns (that folder, sweep)."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text(yaml.safe_dump({
        "name": "s", "results_dir": str(tmp_path / "results"), "methods": ["GRPO"],
        "eval": {"steps": [2], "benchmarks": ["toy"]}, **keys}))
    return cwd, load_sweep(sweep_file)


def test_sqlite_artifacts_stay_with_the_results_not_the_cwd(tmp_path, tiny_model, monkeypatch):
    """Artifacts of a sqlite store go to mlflow-artifacts/ beside it (results/<sweep>/), not
    to ./mlruns of whatever directory the job runs in."""
    cwd, sweep = _sweep_run_from_elsewhere(tmp_path, monkeypatch)
    assert start_parent_run(sweep, tmp_path / "parent") is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the mirror must not fail
        run = train(_cfg(tmp_path, tiny_model, sweep.mlflow_uri))
    assert (run / "mlflow_run_id").exists() and not (run / "mlflow_pending").exists()
    artifacts = tmp_path / "results" / "s" / "mlflow-artifacts"
    assert len(list(artifacts.glob("*/artifacts/sweep.json"))) == 1
    assert len(list(artifacts.glob("*/artifacts/config.yaml"))) == 1
    assert not (cwd / "mlruns").exists()


@pytest.fixture
def mlflow_server(tmp_path):
    """A real `mlflow server` on 127.0.0.1 with its own artifact store."""
    port = closed_port()
    store = tmp_path / "server"
    store.mkdir()
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1", "--backend-store-uri",
         f"sqlite:///{store / 'mlflow.db'}", "--artifacts-destination", str(store / "artifacts")],
        cwd=store, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)  # its own process group: the server and its workers
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(uri + "/health", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail("mlflow server did not start")
                time.sleep(0.5)
        yield uri, store / "artifacts"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_tracking_server_keeps_artifacts_in_its_own_store(tmp_path, mlflow_server, monkeypatch):
    uri, server_artifacts = mlflow_server
    cwd, sweep = _sweep_run_from_elsewhere(tmp_path, monkeypatch, mlflow={"uri": uri})
    run_id = start_parent_run(sweep, tmp_path / "parent")
    assert run_id is not None
    assert len(list(server_artifacts.rglob("sweep.json"))) == 1
    assert not (cwd / "mlruns").exists()
    assert not (tmp_path / "results" / "s" / "mlflow-artifacts").exists()
    assert json.loads(next(server_artifacts.rglob("sweep.json")).read_text())["name"] == "s"
