"""Collect a sweep's run directories into tidy pandas DataFrames, plus metric metadata.

A sweep directory looks like (DESIGN.md, "Data flow"):

    <sweep_dir>/runs/<run_id>/config.yaml           run_id, label, seed, tags, ...
    <sweep_dir>/runs/<run_id>/metrics.jsonl         one JSON object per training step
    <sweep_dir>/runs/<run_id>/eval/step_<N>/<bench>.json   evaluation summary
    <sweep_dir>/runs/<run_id>/DONE                  completion marker

`collect(sweep_dir)` returns a `Collection` (runs, train, eval, warnings); `collect_runs`
returns just the (train_df, eval_df) pair. Damaged inputs never crash collection: a run
without config.yaml is skipped, a half-written last line of metrics.jsonl (a crash mid-write)
is dropped, a malformed summary is skipped; each case emits a `CollectionWarning` naming
the file. `load_metric_meta()` is the registry tables and plots read instead of guessing
direction, display name or format of a metric.

Run: `python -m analysis report --sweep-dir results/<sweep> --out results/<sweep>`.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml
from tqdm import tqdm

from common.layout import INITIAL_DIR

# ---------------------------------------------------------------------------------------
# Metric metadata
# ---------------------------------------------------------------------------------------

AGGREGATIONS = ("mean", "sum", "max", "last")
FORMATS = ("percent", "float", "int", "seconds")


@dataclass(frozen=True)
class MetricMeta:
    """What a metric means and how to show it.

    higher_is_better: True / False for metrics with a direction (used for bold/underline
        ranking); None for diagnostics without one (entropy, KL, lengths, timings).
    aggregation: how a run's per-step values reduce to one number for a run summary:
        "mean", "sum" (per-step counts and times), "max" (per-step maxima), or "last"
        (cumulative counters, and evaluation metrics whose Last/Best tables reduce them).
        Across seeds every metric is averaged and given a standard error.
    fmt: "percent" (a fraction shown x100), "float", "int" or "seconds".
    decimals: digits after the point in the displayed value (after the x100 for percent).
    """

    name: str
    display: str
    higher_is_better: bool | None
    aggregation: str
    fmt: str
    decimals: int
    description: str

    def __post_init__(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"{self.name}: aggregation={self.aggregation!r} not in {AGGREGATIONS}")
        if self.fmt not in FORMATS:
            raise ValueError(f"{self.name}: fmt={self.fmt!r} not in {FORMATS}")

    @property
    def scale(self) -> float:
        """Multiplier from the stored value to the displayed one (100 for percent)."""
        return 100.0 if self.fmt == "percent" else 1.0

    def format(self, value: float) -> str:
        """The displayed string of one value ("59.38" for 0.59375 as percent); "–" for NaN."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "–"
        return f"{value * self.scale:.{self.decimals}f}"

    def axis_label(self) -> str:
        """A plot axis label with the unit."""
        unit = {"percent": " (%)", "seconds": " (s)"}.get(self.fmt, "")
        return f"{self.display}{unit}"


def _m(name, display, hib, agg, fmt, dec, desc) -> MetricMeta:
    return MetricMeta(name, display, hib, agg, fmt, dec, desc)


# One entry per canonical name (shared context "Canonical names"); keep in the same order.
_TRAIN_METRICS = [
    _m("step", "Step", None, "last", "int", 0, "optimizer step (1-based)"),
    _m("reward_mean", "Reward", True, "mean", "float", 3, "mean sequence reward of the batch"),
    _m("reward_std", "Reward std", None, "mean", "float", 3, "std of sequence rewards"),
    _m("acc_mean", "Training accuracy", True, "mean", "percent", 2, "fraction of rollouts correct"),
    _m("response_length_mean", "Response length (tokens)", None, "mean", "float", 1, "mean tokens"),
    _m("response_length_max", "Max response length (tokens)", None, "max", "int", 0, "max tokens"),
    _m("truncated_frac", "Truncated", None, "mean", "percent", 2, "fraction hitting max tokens"),
    _m("entropy", "Entropy", None, "mean", "float", 3, "mean token entropy (nats)"),
    _m("kl_ref_k1", "KL(ref) k1", None, "mean", "float", 4, "policy vs reference, k1"),
    _m("kl_ref_k3", "KL(ref) k3", None, "mean", "float", 4, "policy vs reference, k3"),
    _m("kl_behav_k1", "KL(behav) k1", None, "mean", "float", 4, "policy vs behaviour, k1"),
    _m("kl_behav_k3", "KL(behav) k3", None, "mean", "float", 4, "policy vs behaviour, k3"),
    _m("is_weight_mean", "IS weight", None, "mean", "float", 3, "mean importance weight"),
    _m("is_weight_max", "Max IS weight", None, "max", "float", 3, "max importance weight"),
    _m("clip_frac_upper", "Clip frac (upper)", None, "mean", "percent", 2, "upper clip"),
    _m("clip_frac_lower", "Clip frac (lower)", None, "mean", "percent", 2, "lower clip"),
    _m("clip_frac_dual", "Clip frac (dual)", None, "mean", "percent", 2, "dual clip"),
    _m("pg_loss", "PG loss", None, "mean", "float", 4, "policy-gradient part of the loss"),
    _m("kl_loss", "KL loss", None, "mean", "float", 4, "KL part of the loss"),
    _m("loss", "Loss", None, "mean", "float", 4, "total loss"),
    _m("groups_kept", "Groups kept", None, "sum", "int", 0, "dynamic sampling: kept groups"),
    _m("groups_dropped", "Groups dropped", None, "sum", "int", 0, "dynamic sampling: dropped"),
    _m("gen_batches", "Generation batches", None, "sum", "int", 0, "rollout batches per step"),
    _m("grad_norm", "Grad norm", None, "mean", "float", 3, "gradient norm before clipping"),
    _m("lr", "Learning rate", None, "last", "float", 8, "learning rate"),
    _m("time_rollout", "Rollout time", None, "sum", "seconds", 2, "seconds in rollout"),
    _m("time_logprob", "Log-prob time", None, "sum", "seconds", 2, "seconds in log-probs"),
    _m("time_update", "Update time", None, "sum", "seconds", 2, "seconds in updates"),
    _m("time_step", "Step time", None, "sum", "seconds", 2, "seconds per step"),
    _m("tokens_per_sec", "Tokens/s", True, "mean", "float", 1, "training throughput"),
    _m("rollout_logprob_gap_mean", "Sampler log-prob gap", False, "mean", "float", 6, "mean |log pi_vllm - log pi_trainer| per sampled token"),
    _m("rollout_logprob_gap_max", "Max sampler log-prob gap", False, "max", "float", 6, "max |log pi_vllm - log pi_trainer| over sampled tokens"),
    _m("nonfinite_skips", "Non-finite skips", False, "last", "int", 0,
       "skipped updates so far (the trainer logs a running total)"),
    _m("ref_updates", "Reference updates", None, "last", "int", 0, "reference refreshes so far"),
]

# Keys of one scorer's block in an evaluation summary (shared context, summary schema),
# plus the per-(checkpoint, benchmark) fields collect() copies onto every scorer row.
_EVAL_METRICS = [
    _m("mean", "Mean@n", True, "last", "percent", 2, "average accuracy over all n samples"),
    _m("mean_stderr", "Mean@n s.e.", None, "last", "percent", 2, "s.e. over problems"),
    _m("mean_ci95_low", "Mean@n CI95 low", None, "last", "percent", 2, "bootstrap 95% low"),
    _m("mean_ci95_high", "Mean@n CI95 high", None, "last", "percent", 2, "bootstrap 95% high"),
    _m("extract_fail_rate", "Extraction failures", False, "last", "percent", 2, "no answer"),
    _m("timeout_rate", "Grader timeouts", False, "last", "percent", 2, "grading timed out"),
    _m("error_rate", "Grader errors", False, "last", "percent", 2, "grading raised an error"),
    _m("truncation_rate", "Truncated", False, "last", "percent", 2, "hit max_new_tokens"),
    _m("n", "Samples per problem", None, "last", "int", 0, "n of Mean@n"),
    _m("num_problems", "Problems", None, "last", "int", 0, "problems in the benchmark"),
]

_PATTERNS = [
    (re.compile(r"pass_at_(\d+)"), "Pass@{k}", "unbiased pass@k (Chen et al. 2021)"),
    (re.compile(r"maj_at_(\d+)"), "Maj@{k}", "majority vote over k samples"),
]


def load_metric_meta() -> dict[str, MetricMeta]:
    """The registry of fixed-name metrics (training and evaluation), keyed by name.

    pass_at_<k> and maj_at_<k> are families; look them up with `metric_meta(name)`.
    """
    return {m.name: m for m in _TRAIN_METRICS + _EVAL_METRICS}


def metric_meta(name: str) -> MetricMeta:
    """Metadata of `name`, including pass_at_<k>/maj_at_<k>; KeyError lists what is known."""
    registry = load_metric_meta()
    if name in registry:
        return registry[name]
    for pattern, display, desc in _PATTERNS:
        match = pattern.fullmatch(name)
        if match:
            k = match.group(1)
            return MetricMeta(name, display.format(k=k), True, "last", "percent", 2, desc)
    raise KeyError(
        f"no metadata for metric {name!r}; known: {sorted(registry)} and the families "
        "pass_at_<k>, maj_at_<k> (add it to analysis/collect.py)"
    )


# ---------------------------------------------------------------------------------------
# Collection
# ---------------------------------------------------------------------------------------

RUN_KEYS = ("run_id", "label", "seed")
_STEP_DIR = re.compile(r"step_(\d+)")


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
        num_problems, then the scorer's keys (mean, mean_stderr, pass_at_*, ...).
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
    lines = path.read_text(errors="replace").splitlines()
    by_step: dict[int, dict] = {}
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            step = int(row["step"])
        except (json.JSONDecodeError, TypeError, KeyError, ValueError):
            why = " (the last line, cut short by a crash?)" if lineno == len(lines) else ""
            warn(f"{path}: dropped line {lineno}{why}: not a JSON object with an integer 'step'")
            continue
        if step in by_step:
            warn(f"{path}: step {step} logged twice (resumed run?); keeping line {lineno}")
        by_step[step] = {**row, "step": step}
    return [by_step[s] for s in sorted(by_step)]


def _read_evals(run_dir: Path, warn: _Warner) -> list[dict]:
    """One dict per (step, benchmark, scorer) from run_dir/eval/step_<N>/<bench>.json."""
    rows: list[dict] = []
    eval_root = run_dir / "eval"
    if not eval_root.is_dir():
        return rows
    step_dirs = [d for d in eval_root.iterdir() if d.is_dir() and _STEP_DIR.fullmatch(d.name)]
    for step_dir in sorted(step_dirs, key=lambda d: int(d.name.split("_")[1])):
        step = int(step_dir.name.split("_")[1])
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
            for scorer, values in scorers.items():
                if not isinstance(values, dict) or "mean" not in values:
                    warn(f"{path}: scorer {scorer!r} has no 'mean'; skipped")
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
    runs_root = sweep_dir / "runs"
    if not runs_root.is_dir():
        raise FileNotFoundError(
            f"{runs_root} does not exist; --sweep-dir must be results/<sweep> holding runs/"
        )
    warn = _Warner()
    run_rows, train_rows, eval_rows = [], [], []
    run_dirs = sorted(d for d in runs_root.iterdir() if d.is_dir())
    seen: dict[str, Path] = {}
    for run_dir in tqdm(run_dirs, desc="collect runs", disable=not progress):
        identity = _read_config(run_dir / "config.yaml", warn)
        if identity is None:
            continue
        if identity["run_id"] in seen:
            warn(
                f"skipping {run_dir}: run_id {identity['run_id']!r} already read from "
                f"{seen[identity['run_id']]}"
            )
            continue
        seen[identity["run_id"]] = run_dir
        metrics = _read_metrics(run_dir / "metrics.jsonl", warn)
        evals = _read_evals(run_dir, warn)
        train_rows += [{**identity, **row} for row in metrics]
        eval_rows += [{**identity, **row} for row in evals]
        eval_steps = sorted({r["step"] for r in evals})
        run_rows.append(
            {
                **identity,
                "run_dir": str(run_dir),
                "done": (run_dir / "DONE").exists(),
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
    rows = _read_evals(Path(sweep_dir) / INITIAL_DIR, warn)
    return _frame(rows, ["step", "benchmark", "scorer"])


def collect_runs(sweep_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train_df, eval_df) of a sweep; see `Collection` for their columns."""
    col = collect(sweep_dir)
    return col.train, col.eval
