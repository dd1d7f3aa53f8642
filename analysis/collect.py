"""Collect a sweep's run directories into tidy pandas DataFrames.

A sweep directory looks like:

    <sweep_dir>/runs/<run_id>/config.yaml           run_id, label, seed, tags, ...
    <sweep_dir>/runs/<run_id>/metrics.jsonl         one JSON object per training step
    <sweep_dir>/runs/<run_id>/eval/step_<N>/<bench>.json   evaluation summary
    <sweep_dir>/runs/<run_id>/eval/step_<N>/<bench>.jsonl  per-sample records
    <sweep_dir>/runs/<run_id>/DONE                  completion marker

`collect(sweep_dir)` returns a `Collection` (runs, train, eval, warnings); `collect_runs`
returns just the (train_df, eval_df) pair. Damaged inputs never crash collection: a run
without config.yaml is skipped, a half-written last line of metrics.jsonl (a crash mid-write)
is dropped, a malformed summary is skipped; each case emits a `CollectionWarning` naming
the file. `problem_scores(...)` reads one evaluation's per-sample records back into
per-problem accuracies, and `problem_score_table(runs)` all of a sweep's (what the report's
intervals read and a snapshot ships). What a metric means lives in `common.metrics`.

Run: `python -m analysis report --sweep-dir results/<sweep> --out results/<sweep>`.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml
from tqdm import tqdm

from common.files import read_jsonl
from common.layout import INITIAL_DIR, RunDir, SweepDir
from eval.kl import KEYS as KL_KEYS

# ---------------------------------------------------------------------------------------
# Collection
# ---------------------------------------------------------------------------------------

RUN_KEYS = ("run_id", "label", "seed")


class CollectionWarning(UserWarning):
    """A run file was skipped or truncated while collecting a sweep."""


@dataclass
class Collection:
    """Everything `collect` found in one sweep.

    runs: one row per run (run_id, label, seed, tag_*, run_dir, done, train_steps,
        last_step, eval_steps (list of evaluated steps), has_eval).
    train: one row per (run_id, step): identity columns, then metrics.jsonl keys.
    eval: one row per (run_id, step, benchmark, scorer): identity columns, sampling
        settings (n, temperature, max_new_tokens, template), truncation_rate,
        num_problems, the KL to the initial model (kl_to_initial_k1, _k3 and their
        _stderr: NaN when the summary has none), then the scorer's keys (mean,
        mean_stderr, pass_at_*, ...).
    warnings: the messages of every CollectionWarning emitted.
    """

    sweep_dir: Path
    runs: pd.DataFrame
    train: pd.DataFrame
    eval: pd.DataFrame
    warnings: list[str] = field(default_factory=list)

    @property
    def tag_columns(self) -> list[str]:
        return [c for c in self.runs.columns if c.startswith("tag_")]


class _Warner:
    def __init__(self) -> None:
        self.messages: list[str] = []

    def __call__(self, message: str) -> None:
        self.messages.append(message)
        warnings.warn(message, CollectionWarning, stacklevel=3)


def _read_config(path: Path, warn: _Warner) -> dict | None:
    if not path.is_file():
        warn(f"skipping run {path.parent.name}: {path} is missing")
        return None
    try:
        cfg = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, OSError, UnicodeDecodeError) as exc:
        warn(f"skipping run {path.parent.name}: {path} is not valid YAML ({exc})")
        return None
    if not isinstance(cfg, dict):
        warn(f"skipping run {path.parent.name}: {path} is not a mapping")
        return None
    missing = [k for k in RUN_KEYS if k not in cfg]
    if missing:
        warn(f"skipping run {path.parent.name}: {path} lacks key(s) {missing}")
        return None
    tags = cfg.get("tags") or {}
    if not isinstance(tags, dict):
        warn(f"skipping run {path.parent.name}: {path} key 'tags' is not a mapping")
        return None
    try:
        seed = int(cfg["seed"])
    except (TypeError, ValueError):
        warn(f"skipping run {path.parent.name}: {path} key 'seed'={cfg['seed']!r} is not an int")
        return None
    identity = {"run_id": str(cfg["run_id"]), "label": str(cfg["label"]), "seed": seed}
    identity.update({f"tag_{k}": str(v) for k, v in tags.items()})
    return identity


def _read_metrics(path: Path, warn: _Warner) -> list[dict]:
    """Rows of metrics.jsonl; damaged lines are dropped with a warning, duplicates of a step
    (a resumed run re-logging steps after its last resume state) keep the last line."""
    if not path.is_file():
        warn(f"run {path.parent.name}: {path} is missing (no training metrics)")
        return []

    def dropped(lineno: int, n_lines: int, _line: str) -> None:
        why = " (the last line, cut short by a crash?)" if lineno == n_lines else ""
        warn(f"{path}: dropped line {lineno}{why}: not a JSON object with an integer 'step'")

    by_step: dict[int, dict] = {}
    for row in read_jsonl(path, dropped, require="step"):
        try:
            step = int(row["step"])
        except (TypeError, ValueError):
            warn(f"{path}: dropped a line whose 'step'={row['step']!r} is not an integer")
            continue
        if step in by_step:
            warn(f"{path}: step {step} logged twice (resumed run?); keeping the later line")
        by_step[step] = {**row, "step": step}
    return [by_step[s] for s in sorted(by_step)]


def _read_evals(run_dir: Path, warn: _Warner) -> list[dict]:
    """One dict per (step, benchmark, scorer) from run_dir/eval/step_<N>/<bench>.json."""
    rows: list[dict] = []
    for step, step_dir in RunDir(run_dir).eval_steps():
        for path in sorted(step_dir.glob("*.json")):
            try:
                summary = json.loads(path.read_text())
                benchmark = str(summary["benchmark"])
                scorers = summary["scorers"]
                if not isinstance(scorers, dict) or not scorers:
                    raise KeyError("scorers")
            except (json.JSONDecodeError, KeyError, TypeError, OSError, UnicodeDecodeError) as e:
                warn(f"skipping {path}: not a valid evaluation summary ({type(e).__name__}: {e})")
                continue
            if summary.get("step") is not None and str(summary["step"]) != str(step):
                warn(f"{path}: 'step'={summary['step']} disagrees with its folder; using {step}")
            sampling = summary.get("sampling") or {}
            base = {
                "step": step,
                "benchmark": benchmark,
                "n": sampling.get("n"),
                "temperature": sampling.get("temperature"),
                "max_new_tokens": sampling.get("max_new_tokens"),
                "template": sampling.get("template"),
                "num_problems": summary.get("num_problems"),
                "truncation_rate": summary.get("truncation_rate"),
            }
            kl_block = summary.get("kl_to_initial") or {}  # eval/kl.py; absent: no KL
            base.update({key: kl_block.get(key, math.nan) for key in KL_KEYS})
            for scorer, values in scorers.items():
                if not isinstance(values, dict) or "mean" not in values:
                    warn(f"{path}: scorer {scorer!r} has no 'mean'; skipped")
                    continue
                mean = values["mean"]
                if not (isinstance(mean, (int, float)) and math.isfinite(mean)):
                    # a failed evaluation: no interval can hold it, and the rest still can
                    warn(f"run {run_dir.name}: its step {summary.get('step')} evaluation on "
                         f"{summary.get('benchmark')} has mean {mean!r} for scorer "
                         f"{scorer!r}, not a finite number: a failed evaluation, left out of "
                         "every table (re-run that evaluation)")
                    continue
                rows.append({**base, "scorer": str(scorer), **values})
    return rows


def _frame(rows: list[dict], leading: list[str]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    for col in leading:
        if col not in df.columns:
            df[col] = pd.Series(dtype=object)
    rest = [c for c in df.columns if c not in leading]
    return df[leading + rest]


def collect(sweep_dir: str | Path, *, progress: bool = False) -> Collection:
    """Read every run under `sweep_dir/runs/` (see module docstring); never raises on a
    damaged run, only on a sweep directory without a `runs/` folder."""
    sweep_dir = Path(sweep_dir)
    runs_root = SweepDir(sweep_dir).runs
    if not runs_root.is_dir():
        raise FileNotFoundError(
            f"{runs_root} does not exist; --sweep-dir must be results/<sweep> holding runs/"
        )
    warn = _Warner()
    run_rows, train_rows, eval_rows = [], [], []
    seen: dict[str, Path] = {}
    for run in tqdm(SweepDir(sweep_dir).run_dirs(), desc="collect runs", disable=not progress):
        run_dir = run.root
        identity = _read_config(run.config, warn)
        if identity is None:
            continue
        if identity["run_id"] in seen:
            warn(
                f"skipping {run_dir}: run_id {identity['run_id']!r} already read from "
                f"{seen[identity['run_id']]}"
            )
            continue
        seen[identity["run_id"]] = run_dir
        metrics = _read_metrics(run.metrics, warn)
        evals = _read_evals(run_dir, warn)
        train_rows += [{**identity, **row} for row in metrics]
        eval_rows += [{**identity, **row} for row in evals]
        eval_steps = sorted({r["step"] for r in evals})
        run_rows.append(
            {
                **identity,
                "run_dir": str(run_dir),
                "done": run.done.exists(),
                "train_steps": len(metrics),
                "last_step": metrics[-1]["step"] if metrics else None,
                "eval_steps": eval_steps,
                "has_eval": bool(evals),
            }
        )
    tags = sorted({k for row in run_rows for k in row if k.startswith("tag_")})
    ident = [*RUN_KEYS, *tags]
    runs = _frame(run_rows, ident)
    train = _frame(train_rows, [*ident, "step"])
    evals = _frame(eval_rows, [*ident, "step", "benchmark", "scorer"])
    for df in (runs, train, evals):
        for tag in tags:  # a run without a tag gets "" rather than NaN: groupby-safe
            df[tag] = df[tag].fillna("").astype(str)
    return Collection(sweep_dir, runs, train, evals, warn.messages)


def collect_initial(sweep_dir: str | Path) -> pd.DataFrame:
    """Evaluation rows (step 0) of the sweep's initial model, from
    `<sweep_dir>/initial/eval/step_0/<bench>.json`; empty when it was not evaluated."""
    warn = _Warner()
    rows = _read_evals(SweepDir(sweep_dir).initial.root, warn)
    return _frame(rows, ["step", "benchmark", "scorer"])


def collect_runs(sweep_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train_df, eval_df) of a sweep; see `Collection` for their columns."""
    col = collect(sweep_dir)
    return col.train, col.eval


SCORE_COLUMNS = ["run_id", "step", "benchmark", "scorer", "problem_id", "correct", "samples"]


def _record_counts(path: Path) -> dict[str, dict[str, list[int]]]:
    """{scorer: {problem_id: [correct, samples]}} of one per-sample records file; a
    malformed line raises ValueError naming the file and line (a half-written per-sample
    file would silently bias a paired comparison, so it is not dropped)."""
    hits: dict[str, dict[str, list[int]]] = {}
    for number, record in enumerate(read_jsonl(path, require="problem_id"), start=1):
        try:
            pid = str(record["problem_id"])
            for scorer, grade in record["scorers"].items():
                counts = hits.setdefault(scorer, {}).setdefault(pid, [0, 0])
                counts[0] += bool(grade["correct"])
                counts[1] += 1
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(
                f"{path} record {number}: not a per-sample record with problem_id and "
                f"scorers.<name>.correct ({type(exc).__name__}: {exc}); re-run its evaluation"
            ) from exc
    return hits


def problem_scores(run_dir: str | Path, step: int, benchmark: str) -> dict[str, dict[str, float]]:
    """Per-problem Mean@n of one evaluation, {scorer: {problem_id: fraction correct}}, from
    `run_dir/eval/step_<step>/<benchmark>.jsonl` (one record per problem x sample, written
    by the evaluation next to its summary). {} when the file is absent or holds no records."""
    path = RunDir(run_dir).eval_samples(step, benchmark)
    if not path.is_file():
        return {}
    return {scorer: {pid: c / n for pid, (c, n) in by_problem.items()}
            for scorer, by_problem in _record_counts(path).items()}


def problem_score_table(runs: pd.DataFrame, *, initial: str | Path | None = None,
                        progress: bool = False) -> pd.DataFrame:
    """Every per-problem score of a sweep, one row per (run_id, step, benchmark, scorer,
    problem_id) with `correct` of `samples` (SCORE_COLUMNS), from each run's per-sample
    records (`runs`: collect()'s runs frame), and the initial model's (run_id INITIAL_DIR,
    step 0) when `initial` (`SweepDir.initial.root`) holds them. It is what every interval of
    the report reads, and what a snapshot ships (`SweepDir.problem_scores`) so the intervals
    can be recomputed without the records."""
    rows = []
    dirs = [(r.run_id, r.run_dir) for r in runs.itertuples()]
    if initial is not None and Path(initial).is_dir():
        dirs.append((INITIAL_DIR, initial))
    for run_id, run_dir in tqdm(dirs, desc="per-problem scores", disable=not progress):
        for step, step_dir in RunDir(run_dir).eval_steps():
            for path in sorted(step_dir.glob("*.jsonl")):
                for scorer, by_problem in _record_counts(path).items():
                    rows += [(run_id, step, path.stem, scorer, pid, c, n)
                             for pid, (c, n) in by_problem.items()]
    return pd.DataFrame(rows, columns=SCORE_COLUMNS)
