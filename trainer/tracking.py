"""Metrics: `metrics.jsonl` (the source of truth) and an MLflow mirror that cannot stall a run.

The JSONL file gets one line per step, flushed at once. MLflow work (creating the run,
params, metric batches, the config artifact) happens on a background thread fed by a
queue: the training loop only enqueues, and the thread sends what queued up every
`FLUSH_EVERY_S` seconds (and at close) as one batch. Any MLflow error becomes one warning
and the mirror switches itself off; an unreachable server costs at most `close_timeout_s`
at exit.

The MLflow run id is stored in `<out_dir>/mlflow_run_id`, reused on resume (no duplicate
runs) and read by evaluation to log into the same run. When the mirror fails it leaves
`<out_dir>/mlflow_pending`, so a later `python -m sweep mlflow-sync` (the workflow runs it
on the next invocation) can attach the run from the files (`attach_run`).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import warnings
from pathlib import Path

from common.files import read_jsonl, read_run_id, read_yaml, write_atomic
from common.layout import CONFIG, RunDir
from common.tracking import (
    client,
    ensure_experiment,
    mark_pending,
    short_error,
)

log = logging.getLogger(__name__)

# The mirror sends the metrics it has queued at most this often (and at close).
FLUSH_EVERY_S = 5.0


def read_metrics(path: Path) -> list[dict]:
    """The rows of a metrics.jsonl; a line that is not a JSON object with an integer `step`
    (the last line, cut short by a crash mid-write) is dropped with a warning."""
    if not Path(path).exists():
        return []

    def dropped(lineno: int, n_lines: int, _line: str) -> None:
        warnings.warn(f"{path}: dropped line {lineno} of {n_lines}: not a JSON object "
                      "with an integer 'step' (cut short by a crash?)", stacklevel=4)

    rows = []
    for row in read_jsonl(path, dropped, require="step"):
        try:
            row["step"] = int(row["step"])
        except (TypeError, ValueError):
            warnings.warn(f"{path}: dropped a line whose 'step' is {row['step']!r}, not an "
                          "integer", stacklevel=2)
            continue
        rows.append(row)
    return rows


class MetricsFile:
    """Append-only metrics.jsonl; on resume, lines after the last completed step are dropped
    (and a torn line, see `read_metrics`), so the file holds one line per step."""

    def __init__(self, path: Path, resume_step: int = 0) -> None:
        self.path = Path(path)
        kept = [row for row in read_metrics(self.path) if row["step"] <= resume_step]
        write_atomic(self.path, "".join(json.dumps(row) + "\n" for row in kept))
        self._fh = self.path.open("a")

    def write(self, metrics: dict) -> None:
        self._fh.write(json.dumps(metrics) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def _flatten(d: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = str(v)[:500]  # MLflow caps param values
    return out


def open_run(mlflow_client, uri: str, experiment: str, out_dir: Path, *, run_name: str,
             tags: dict[str, str], params: dict, config_yaml: str,
             parent_run_id: str | None = None) -> str:
    """The MLflow run of `out_dir`: the one in `<out_dir>/mlflow_run_id` (resume), else a new
    run with tags, params and `config.yaml`, whose id is then written to that file."""
    from mlflow.entities import Param, RunTag

    run_file = RunDir(out_dir).mlflow_run_id
    run_id = read_run_id(run_file)
    if run_id is not None and not _run_exists(mlflow_client, run_id):
        warnings.warn(f"{run_file}: MLflow run {run_id} is not in the store (a new store?); "
                      "creating a new run", stacklevel=2)
        run_id = None
    if run_id is not None:
        mlflow_client.update_run(run_id, status="RUNNING")
    else:
        exp_id = ensure_experiment(mlflow_client, experiment, uri)
        all_tags = {**tags, "mlflow.runName": run_name}
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run_id = mlflow_client.create_run(exp_id, run_name=run_name, tags=all_tags).info.run_id
        write_atomic(run_file, run_id + "\n")
        flat = [Param(k, v) for k, v in _flatten(params).items()]
        for i in range(0, len(flat), 100):  # MLflow's per-call param cap
            mlflow_client.log_batch(run_id, params=flat[i : i + 100])
        mlflow_client.log_text(run_id, config_yaml, CONFIG)
    mlflow_client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    return run_id


def _run_exists(mlflow_client, run_id: str) -> bool:
    from mlflow.exceptions import MlflowException

    try:
        mlflow_client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return False
        raise
    return True


def log_metric_rows(mlflow_client, run_id: str, rows: list[tuple[int, dict]]) -> None:
    """Log (step, {name: value}) rows; non-numeric values (None) are skipped."""
    from mlflow.entities import Metric

    metrics = [Metric(k, float(v), 0, step) for step, m in rows for k, v in m.items()
               if isinstance(v, int | float) and not isinstance(v, bool)]
    for i in range(0, len(metrics), 1000):  # MLflow's per-call metric cap
        mlflow_client.log_batch(run_id, metrics=metrics[i : i + 1000])


def attach_run(uri: str, experiment: str, out_dir: Path, *, parent_run_id: str | None = None,
               extra_rows: list[tuple[int, dict]] = ()) -> str:
    """Bring MLflow up to date with a run directory after a failed mirror: create the run
    if it has none (from `config.yaml`), log every (step, metric) of metrics.jsonl and of
    `extra_rows` (evaluation summaries) that MLflow lacks, end it FINISHED if the run is
    DONE, and remove `mlflow_pending`. Raises on MLflow errors (the caller warns)."""
    run = RunDir(out_dir)
    cfg = read_yaml(run.config)
    c = client(uri)
    run_id = open_run(c, uri, experiment, run.root, run_name=str(cfg.get("run_id", run.root.name)),
                      tags={k: str(v) for k, v in (cfg.get("tags") or {}).items()}, params=cfg,
                      config_yaml=run.config.read_text(), parent_run_id=parent_run_id)
    rows = [(row["step"], row) for row in read_metrics(run.metrics)]
    rows += list(extra_rows)
    have = {(m.key, m.step) for key in {k for _, m in rows for k in m}
            for m in c.get_metric_history(run_id, key)}
    missing = [(step, {k: v for k, v in m.items() if (k, step) not in have}) for step, m in rows]
    log_metric_rows(c, run_id, missing)
    c.set_terminated(run_id, status="FINISHED" if run.done.exists() else "KILLED")
    run.mlflow_pending.unlink(missing_ok=True)
    return run_id


class MLflowMirror:
    """Mirror of the metrics into MLflow on a background thread (see module doc)."""

    def __init__(self, uri: str, experiment: str, out_dir: Path, *, run_name: str,
                 tags: dict[str, str], params: dict, config_yaml: str,
                 parent_run_id: str | None = None, close_timeout_s: float = 30.0,
                 flush_every_s: float = FLUSH_EVERY_S) -> None:
        self.out_dir = Path(out_dir)
        self.close_timeout_s = close_timeout_s
        self.flush_every_s = flush_every_s
        self.run_id: str | None = None
        self._queue: queue.Queue = queue.Queue()
        self._failed = False
        self._thread = threading.Thread(
            target=self._worker, name="mlflow-mirror", daemon=True,
            args=(uri, experiment, run_name, tags, params, config_yaml, parent_run_id),
        )
        self._thread.start()

    def log_metrics(self, step: int, metrics: dict) -> None:
        if not self._failed:
            self._queue.put(("metrics", step, metrics))

    def close(self, status: str = "FINISHED") -> None:
        """Flush and end the run (status FINISHED, KILLED on preemption, FAILED on error)."""
        self._queue.put(("close", status, None))
        self._thread.join(self.close_timeout_s)
        if self._thread.is_alive():
            mark_pending(self.out_dir, f"mirror still busy after {self.close_timeout_s}s")
            warnings.warn(f"MLflow mirror did not finish within {self.close_timeout_s}s; "
                          "metrics.jsonl is complete, MLflow may miss the last steps "
                          "(a later `python -m sweep mlflow-sync` adds them)", stacklevel=2)

    def _worker(self, uri, experiment, run_name, tags, params, config_yaml, parent_run_id):
        try:
            c = client(uri)
            self.run_id = open_run(c, uri, experiment, self.out_dir, run_name=run_name,
                                   tags=tags, params=params, config_yaml=config_yaml,
                                   parent_run_id=parent_run_id)
        except Exception as e:  # noqa: BLE001 - MLflow must never stop training
            self._fail(e)
            return
        while True:
            kind, a, b = self._queue.get()
            batch = [(kind, a, b)]
            # Collect for flush_every_s (or until close): one MLflow call per interval, not
            # per step. Each call is a sqlite transaction (~40 ms of CPU, measured), which a
            # one-core job pays beside its training steps.
            until = time.monotonic() + self.flush_every_s
            while kind == "metrics":
                try:
                    kind, a, b = self._queue.get(timeout=max(0.0, until - time.monotonic()))
                except queue.Empty:
                    break
                batch.append((kind, a, b))
            try:
                log_metric_rows(c, self.run_id, [(step, m) for kd, step, m in batch
                                                 if kd == "metrics"])
                if batch[-1][0] == "close":
                    c.set_terminated(self.run_id, status=batch[-1][1])
                    return
            except Exception as e:  # noqa: BLE001
                self._fail(e)
                return

    def _fail(self, e: Exception) -> None:
        self._failed = True
        first = short_error(e)
        mark_pending(self.out_dir, f"training mirror: {type(e).__name__}: {first}")
        warnings.warn(f"MLflow logging disabled for this run: {type(e).__name__}: {first}; "
                      "metrics.jsonl is complete and a later `snakemake` run attaches it to "
                      "MLflow", stacklevel=2)
        log.debug("MLflow error", exc_info=e)


class Tracker:
    """metrics.jsonl + optional MLflow mirror behind one `log(step, metrics)` call."""

    def __init__(self, out_dir: Path, tracking_cfg, *, resume_step: int, run_name: str,
                 tags: dict[str, str], params: dict, config_yaml: str) -> None:
        self.file = MetricsFile(RunDir(out_dir).metrics, resume_step)
        self.mlflow = None
        if tracking_cfg.mlflow_uri:
            self.mlflow = MLflowMirror(
                tracking_cfg.mlflow_uri, tracking_cfg.experiment, out_dir, run_name=run_name,
                tags=tags, params=params, config_yaml=config_yaml,
                parent_run_id=tracking_cfg.parent_run_id,
            )

    def log(self, step: int, metrics: dict) -> None:
        self.file.write(metrics)
        if self.mlflow is not None:
            self.mlflow.log_metrics(step, metrics)

    def close(self, status: str = "FINISHED") -> None:
        self.file.close()
        if self.mlflow is not None:
            self.mlflow.close(status)
