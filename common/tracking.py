"""MLflow access shared by the trainer, evaluation and the sweep: fail fast, keep artifacts
with the results, and remember what still has to reach MLflow.

Why one module: every job of a sweep talks to the same store, and each of these rules must
hold in all of them (README, "What we survive"):
  * an unreachable tracking server costs seconds, not MLflow's ~4 minutes of HTTP retries
    per call (`client` probes `/health` once);
  * with a sqlite store, artifacts go to `mlflow-artifacts/` beside the database file
    (`results/<sweep>/mlflow-artifacts/` by default), never to `./mlruns` of whatever
    directory a job runs in; with a server, to the server's artifact store;
  * a job that could not mirror its results leaves `<run_dir>/mlflow_pending`; the next
    `snakemake` invocation attaches those runs (`python -m sweep mlflow-sync`).
"""

from __future__ import annotations

import logging
import re
import urllib.error
import urllib.request
from pathlib import Path

from common.layout import RunDir

ARTIFACT_DIR = "mlflow-artifacts"  # beside a sqlite database file
PROBE_TIMEOUT_S = 5.0


class TrackingUnavailable(RuntimeError):
    """The tracking server did not answer its health check."""


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///...` URI, else None."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def artifact_root(uri: str) -> str | None:
    """Where a new experiment keeps its artifacts: `mlflow-artifacts/` beside a sqlite
    database (absolute file URI), or None to let a tracking server use its own store."""
    db = sqlite_path(uri)
    return None if db is None else (db.parent / ARTIFACT_DIR).resolve().as_uri()


def client(uri: str, timeout_s: float = PROBE_TIMEOUT_S):
    """An MlflowClient for `uri` that has been checked to answer.

    http(s): one GET of the server's /health with `timeout_s` (no retries); raises
    TrackingUnavailable when it fails. sqlite: creates the database's folder.
    """
    from mlflow.tracking import MlflowClient

    # The sqlite store logs a full SQLAlchemy traceback before raising; the caller turns the
    # exception into one warning, so the traceback is noise (55 lines for a read-only file).
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s):
                pass
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise TrackingUnavailable(f"tracking server {uri} does not answer ({reason})") from None
    db = sqlite_path(uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    return MlflowClient(tracking_uri=uri)


# MLflow 3.x's UI opens an experiment without this tag on its GenAI trace overview ("No
# data" for a training sweep); with it, on the runs table. MLflow 3.17's UI decides by its
# global "GenAI / Model training" switch instead (remembered in the browser, GenAI at
# first), which the `workflowType` parameter of RUNS_PAGE sets: the link the docs give.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
RUNS_PAGE = "#/experiments/{experiment_id}?workflowType=machine_learning"


def ensure_experiment(mlflow_client, name: str, uri: str) -> str:
    """The id of experiment `name`, created (artifacts per `artifact_root`) when missing,
    tagged as a training experiment (`EXPERIMENT_KIND`) so the UI opens on its runs; an
    older untagged experiment gets the tag too."""
    exp = mlflow_client.get_experiment_by_name(name)
    if exp is None:
        return mlflow_client.create_experiment(name, artifact_location=artifact_root(uri),
                                               tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    if EXPERIMENT_KIND_TAG not in exp.tags:
        mlflow_client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return exp.experiment_id


def short_error(exc: BaseException) -> str:
    """One line for a warning: the driver's own error when there is one (SQLAlchemy wraps
    `(sqlite3.OperationalError) attempt to write a readonly database` in several lines)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    driver = [line for line in lines if re.match(r"\(\w+\.\w+\) ", line)]
    text = (driver or lines or [type(exc).__name__])[0]
    return text[:300]


def mark_pending(run_dir: str | Path, reason: str) -> None:
    """Note in `<run_dir>/mlflow_pending` that this run's results did not reach MLflow.

    Appends one line (concurrent evaluation jobs of one run each add theirs); never raises.
    """
    try:
        path = RunDir(run_dir).mlflow_pending
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(" ".join(reason.split())[:500] + "\n")
    except OSError:
        pass
