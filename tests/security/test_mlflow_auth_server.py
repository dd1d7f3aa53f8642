"""A real `mlflow server --app-name basic-auth` on 127.0.0.1, set up as docs/mlflow.md's recipe says,
and a micro sweep (one method, two steps, one toy evaluation) logging into it with the
credentials in the environment only. Checks: the runs arrived; requests without (or with
wrong) credentials get 401, another user gets 403, a foreign Host header gets 403; and the
password and username appear in no file the sweep wrote and in no MLflow param, tag or artifact.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml
from workflow_helpers import REPO, run_snakemake

pytestmark = pytest.mark.slow

STEPS = 2
ADMIN = "admin"
USER = f"sweeper-{secrets.token_hex(4)}"  # distinctive: a match anywhere is a leak
PASSWORD = secrets.token_urlsafe(24)
OTHER, OTHER_PASSWORD = "other", secrets.token_urlsafe(16)  # another lab member
AUTH_INI = """\
[mlflow]
default_permission = NO_PERMISSIONS
database_uri = sqlite:///{db}
admin_username = {admin}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mlflow_exe() -> str:
    local = Path(sys.executable).with_name("mlflow")
    return str(local) if local.exists() else shutil.which("mlflow")


def wait_until_up(proc: subprocess.Popen, url: str, log: Path, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"mlflow server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if requests.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.5)
    pytest.fail(f"mlflow server not up after {timeout}s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The server (its own backend store, artifact root and auth db in tmp), with one user."""
    home = tmp_path_factory.mktemp("mlflow-server")
    (home / "basic_auth.ini").write_text(AUTH_INI.format(db=home / "basic_auth.db", admin=ADMIN))
    admin_password = secrets.token_urlsafe(16)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    env.update(MLFLOW_AUTH_CONFIG_PATH=str(home / "basic_auth.ini"),
               MLFLOW_AUTH_ADMIN_PASSWORD=admin_password,
               MLFLOW_FLASK_SERVER_SECRET_KEY=secrets.token_hex(16))
    log = home / "server.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [mlflow_exe(), "server", "--app-name", "basic-auth",
             "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
             "--allowed-hosts", f"127.0.0.1:{port},localhost:{port}",
             "--cors-allowed-origins", f"http://127.0.0.1:{port}",
             "--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}",
             "--artifacts-destination", str(home / "artifacts")],
            cwd=home, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until_up(proc, url, log)
        # docs/mlflow.md's way to add a user: the auth client, admin credentials from the environment.
        from mlflow.server import get_app_client

        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MLFLOW_TRACKING_USERNAME", ADMIN)
            mp.setenv("MLFLOW_TRACKING_PASSWORD", admin_password)
            auth = get_app_client("basic-auth", tracking_uri=url)
            auth.create_user(username=USER, password=PASSWORD)
            auth.create_user(username=OTHER, password=OTHER_PASSWORD)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its uvicorn workers
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def sweep(server, tmp_path_factory):
    """A micro sweep run by real Snakemake, credentials in the environment, the URI plain."""
    root = tmp_path_factory.mktemp("secure-sweep")
    cfg = {
        "name": "secure",
        "results_dir": str(root / "results"),
        "tiny": {"sft_steps": 20},
        "base": {
            "model": {"path": "tiny"},
            "task": {"kind": "toy", "num_prompts": 16},
            "rollout": {"n": 2, "prompts_per_step": 2, "max_new_tokens": 12},
            "optim": {"steps": STEPS},
            "tracking": {"progress": False},
        },
        "methods": ["GRPO"],
        "eval": {"steps": [STEPS], "benchmarks": ["toy"], "n": 1, "max_new_tokens": 12,
                 "limit": {"toy": 2}, "scorers": ["dapo"]},
        "mlflow": {"uri": server},
    }
    config = root / "secure.yaml"
    config.write_text(yaml.safe_dump(cfg))
    target = str(root / f"results/secure/runs/grpo_s0/eval/step_{STEPS}/toy.json")  # no report
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_USERNAME", USER)
        mp.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
        run_snakemake("--snakefile", str(REPO / "Snakefile"), "--directory", str(root),
                      "--configfile", str(config), "-c", "2", target, cwd=root, timeout=900)
    return root


@pytest.fixture
def as_user(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", USER)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)


def experiment_runs(url: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=url)
    exp = client.get_experiment_by_name("secure")
    assert exp is not None, "the sweep's experiment never reached the server"
    return client, exp, client.search_runs([exp.experiment_id])


def test_runs_arrive_with_credentials_from_the_environment(server, sweep, as_user):
    client, _, runs = experiment_runs(server)
    parents = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("method") == "GRPO"]
    assert len(parents) == 1 and len(children) == 1
    child = children[0]
    assert child.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
    assert child.data.params["tracking.mlflow_uri"] == server  # the sweep's URI, unchanged
    history = client.get_metric_history(child.info.run_id, "reward_mean")
    assert [m.step for m in history] == list(range(1, STEPS + 1))
    assert [m.step for m in client.get_metric_history(child.info.run_id, "eval/toy/dapo/mean")] == [STEPS]


def test_requests_without_the_right_credentials_are_refused(server, sweep):
    search = f"{server}/api/2.0/mlflow/experiments/get-by-name"
    params = {"experiment_name": "secure"}
    assert requests.get(search, params=params, auth=(USER, PASSWORD), timeout=30).status_code == 200
    assert requests.get(search, params=params, timeout=30).status_code == 401
    assert requests.get(search, params=params, auth=(USER, "wrong"), timeout=30).status_code == 401
    # default_permission = NO_PERMISSIONS: another lab member cannot read this user's runs
    other = requests.get(search, params=params, auth=(OTHER, OTHER_PASSWORD), timeout=30)
    assert other.status_code == 403
    # --allowed-hosts: a request naming a foreign host (DNS rebinding) is rejected
    rebinding = requests.get(search, params=params, auth=(USER, PASSWORD), timeout=30,
                             headers={"Host": "attacker.example:80"})
    assert rebinding.status_code == 403


def test_credentials_are_written_nowhere(server, sweep, as_user, tmp_path):
    secrets_ = [PASSWORD.encode(), USER.encode()]
    leaks = [str(p) for p in sweep.rglob("*") if p.is_file()
             and any(s in p.read_bytes() for s in secrets_)]
    assert leaks == []
    assert any((sweep / "results" / "secure" / "runs").rglob("metrics.jsonl"))  # scanned real output
    client, _, runs = experiment_runs(server)
    for run in runs:
        for key, value in {**run.data.params, **run.data.tags}.items():
            assert PASSWORD not in f"{key}={value}" and USER not in f"{key}={value}", key
        local = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / run.info.run_id)))
        files = [p for p in local.rglob("*") if p.is_file()]
        assert files, f"run {run.info.run_id} has no artifacts to check"
        assert not [p for p in files if any(s in p.read_bytes() for s in secrets_)]
