"""Metrics: `metrics.jsonl` (the source of truth) and an MLflow mirror that cannot stall a run.

The JSONL file gets one line per step, flushed at once. MLflow work (creating the run,
params, metric batches, the config artifact) happens on a background thread fed by a
queue: the training loop only enqueues. Any MLflow error becomes one warning and the
mirror switches itself off; an unreachable server costs at most `close_timeout_s` at exit.

The MLflow run id is stored in `<out_dir>/mlflow_run_id`, reused on resume (no duplicate
runs) and read by evaluation to log into the same run.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import warnings
from pathlib import Path

log = logging.getLogger(__name__)
RUN_ID_FILE = "mlflow_run_id"


class MetricsFile:
    """Append-only metrics.jsonl; on resume, lines after the last completed step are dropped."""

    def __init__(self, path: Path, resume_step: int = 0) -> None:
        self.path = Path(path)
        kept = []
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                if line.strip() and json.loads(line)["step"] <= resume_step:
                    kept.append(line)
        self.path.write_text("".join(k + "\n" for k in kept))
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


class MLflowMirror:
    """Mirror of the metrics into MLflow on a background thread (see module doc)."""

    def __init__(self, uri: str, experiment: str, out_dir: Path, *, run_name: str,
                 tags: dict[str, str], params: dict, config_yaml: str,
                 parent_run_id: str | None = None, close_timeout_s: float = 30.0) -> None:
        self.out_dir = Path(out_dir)
        self.close_timeout_s = close_timeout_s
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
            warnings.warn(f"MLflow mirror did not finish within {self.close_timeout_s}s; "
                          "metrics.jsonl is complete, MLflow may miss the last steps",
                          stacklevel=2)

    def _worker(self, uri, experiment, run_name, tags, params, config_yaml, parent_run_id):
        try:
            from mlflow.entities import Metric, Param, RunTag
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=uri)
            run_file = self.out_dir / RUN_ID_FILE
            if run_file.exists():  # resume: same MLflow run
                self.run_id = run_file.read_text().strip()
                client.update_run(self.run_id, status="RUNNING")
            else:
                exp = client.get_experiment_by_name(experiment)
                exp_id = exp.experiment_id if exp else client.create_experiment(experiment)
                all_tags = {**tags, "mlflow.runName": run_name}
                if parent_run_id:
                    all_tags["mlflow.parentRunId"] = parent_run_id
                run = client.create_run(exp_id, run_name=run_name, tags=all_tags)
                self.run_id = run.info.run_id
                tmp = run_file.with_suffix(".tmp")
                tmp.write_text(self.run_id + "\n")
                tmp.replace(run_file)
                client.log_batch(self.run_id, params=[
                    Param(k, v) for k, v in _flatten(params).items()])
                client.log_text(self.run_id, config_yaml, "config.yaml")
            client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        except Exception as e:  # noqa: BLE001 - MLflow must never stop training
            self._fail(e)
            return
        while True:
            kind, a, b = self._queue.get()
            batch = [(kind, a, b)]
            while not self._queue.empty() and kind == "metrics":  # drain: one call per burst
                kind, a, b = self._queue.get()
                batch.append((kind, a, b))
            try:
                metrics = [Metric(k, float(v), 0, step) for kd, step, m in batch
                           if kd == "metrics" for k, v in m.items() if isinstance(v, int | float)]
                for i in range(0, len(metrics), 1000):  # MLflow's per-call metric cap
                    client.log_batch(self.run_id, metrics=metrics[i : i + 1000])
                if batch[-1][0] == "close":
                    client.set_terminated(self.run_id, status=batch[-1][1])
                    return
            except Exception as e:  # noqa: BLE001
                self._fail(e)
                return

    def _fail(self, e: Exception) -> None:
        self._failed = True
        warnings.warn(f"MLflow logging disabled for this run: {type(e).__name__}: {e}",
                      stacklevel=2)
        log.warning("MLflow error: %s", e)


class Tracker:
    """metrics.jsonl + optional MLflow mirror behind one `log(step, metrics)` call."""

    def __init__(self, out_dir: Path, tracking_cfg, *, resume_step: int, run_name: str,
                 tags: dict[str, str], params: dict, config_yaml: str) -> None:
        self.file = MetricsFile(Path(out_dir) / "metrics.jsonl", resume_step)
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
