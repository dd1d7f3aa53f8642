"""The sweep's MLflow side: a parent run per `snakemake` invocation, and the sync that
attaches runs whose jobs could not reach MLflow.

Training jobs attach to the parent as nested runs (`mlflow.parentRunId`). A failure to
reach MLflow is a warning, never a failed sweep, because metrics.jsonl and the evaluation
summaries are the source of truth: a job that could not mirror leaves
`<run_dir>/mlflow_pending`, and the next invocation runs `python -m sweep mlflow-sync`,
which rebuilds the MLflow run from the files (`pending_runs`, `sync_pending`).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable
from pathlib import Path

from common.layout import RunDir, SweepDir
from common.tracking import client, ensure_experiment, mark_pending, short_error
from eval.run import summary_metrics
from trainer.tracking import attach_run

from .spec import SweepConfig


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=3)


def start_parent_run(sweep: SweepConfig, path: str | Path,
                     on_error: Callable[[str], None] = _warn) -> str | None:
    """Create the parent run, write its id to `path`, return it (None when disabled/failed).

    A failure is one line passed to `on_error` (a warning by default; Snakemake's onstart
    hook prints it, as Snakemake does not show warnings raised there)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not sweep.mlflow.enabled:
        path.write_text("")
        return None
    try:
        c = client(sweep.mlflow_uri)
        exp_id = ensure_experiment(c, sweep.experiment, sweep.mlflow_uri)
        run = c.create_run(exp_id, run_name=f"{sweep.name} sweep",
                           tags={"sweep": sweep.name, "kind": "sweep"})
        c.log_text(run.info.run_id, json.dumps(sweep.model_dump(), indent=2), "sweep.json")
    except Exception as exc:  # noqa: BLE001 - tracking must never stop a sweep
        on_error(f"MLflow parent run not created ({short_error(exc)}); the sweep runs on "
                 "and the next invocation attaches its runs to MLflow")
        path.write_text("")
        return None
    path.write_text(run.info.run_id)
    return run.info.run_id


def end_parent_run(sweep: SweepConfig, path: str | Path, ok: bool,
                   on_error: Callable[[str], None] = _warn) -> None:
    """End the parent run named in `path` now (FINISHED when `ok`, else FAILED), so its span
    in MLflow is the invocation's, from `start_parent_run` (Snakemake's onstart) to here
    (onsuccess/onerror). A sweep killed before either hook leaves it RUNNING. Nothing to
    do without a parent run; a failure is one line to `on_error`."""
    try:
        run_id = Path(path).read_text().strip()
    except OSError:
        run_id = ""
    if not sweep.mlflow.enabled or not run_id:
        return
    try:
        client(sweep.mlflow_uri).set_terminated(run_id, "FINISHED" if ok else "FAILED")
    except Exception as exc:  # noqa: BLE001 - tracking must never stop a sweep
        on_error(f"MLflow parent run {run_id} not ended ({short_error(exc)}); its duration "
                 "in the UI is open-ended")


def pending_runs(sweep_dir: str | Path) -> list[Path]:
    """Run directories whose results have not all reached MLflow (they hold mlflow_pending)."""
    return [run.root for run in SweepDir(sweep_dir).run_dirs() if run.mlflow_pending.exists()]


def pending_digest(run_dirs: list[Path]) -> str:
    """A short hash of the pending runs and their notes: it changes whenever a note is added
    (a failed sync adds one), so the workflow's sync stamp is new on every retry."""
    h = hashlib.sha256()
    for run_dir in run_dirs:
        h.update(run_dir.name.encode() + b"\0")
        try:
            h.update(RunDir(run_dir).mlflow_pending.read_bytes())
        except OSError:
            pass
    return h.hexdigest()[:16]


def _eval_rows(run_dir: Path) -> list[tuple[int, dict]]:
    """(step, MLflow metrics) of every evaluation summary of a run."""
    rows = []
    for path in sorted(RunDir(run_dir).eval_root.glob("step_*/*.json")):
        try:
            summary = json.loads(path.read_text())
            rows.append((int(summary["step"] or 0), summary_metrics(summary)))
        except (ValueError, KeyError, TypeError, OSError) as exc:
            warnings.warn(f"{path}: not a readable evaluation summary ({exc}); skipped",
                          stacklevel=2)
    return rows


def sync_pending(sweep_dir: str | Path, uri: str, experiment: str,
                 parent_run_id: str | None = None) -> tuple[list[str], list[str]]:
    """Attach every pending run of the sweep to MLflow; returns (attached, still pending).

    Never raises on MLflow trouble: a run that fails stays pending, with a warning.
    """
    attached, failed = [], []
    for run_dir in pending_runs(sweep_dir):
        try:
            attach_run(uri, experiment, run_dir, parent_run_id=parent_run_id,
                       extra_rows=_eval_rows(run_dir))
        except Exception as exc:  # noqa: BLE001 - tracking must never stop a sweep
            first = short_error(exc)
            warnings.warn(f"{run_dir.name}: still not in MLflow ({first}); a later run of "
                          "`snakemake` (or `python -m sweep mlflow-sync`) tries again",
                          stacklevel=2)
            mark_pending(run_dir, f"sync: {first}")
            failed.append(run_dir.name)
        else:
            attached.append(run_dir.name)
    return attached, failed
