"""The sweep's MLflow parent run: one per `snakemake` invocation, children per training job.

Training jobs attach to it as nested runs (`mlflow.parentRunId`); a failure to reach MLflow
is a warning, never a failed sweep, because metrics.jsonl is the source of truth.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from .spec import SweepConfig


def start_parent_run(sweep: SweepConfig, path: str | Path) -> str | None:
    """Create the parent run, write its id to `path`, return it (None when disabled/failed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not sweep.mlflow.enabled:
        path.write_text("")
        return None
    try:
        from mlflow.tracking import MlflowClient

        if sweep.mlflow_uri.startswith("sqlite:///"):
            Path(sweep.mlflow_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        client = MlflowClient(tracking_uri=sweep.mlflow_uri)
        exp = client.get_experiment_by_name(sweep.experiment)
        exp_id = exp.experiment_id if exp else client.create_experiment(sweep.experiment)
        run = client.create_run(exp_id, run_name=f"{sweep.name} sweep",
                                tags={"sweep": sweep.name, "kind": "sweep"})
        client.log_text(run.info.run_id, json.dumps(sweep.model_dump(), indent=2), "sweep.json")
        client.set_terminated(run.info.run_id)
    except Exception as exc:  # noqa: BLE001 - tracking must never stop a sweep
        warnings.warn(f"MLflow parent run not created ({exc}); runs are tracked unparented",
                      stacklevel=2)
        path.write_text("")
        return None
    path.write_text(run.info.run_id)
    return run.info.run_id
