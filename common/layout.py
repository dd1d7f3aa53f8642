"""Where everything of a sweep and of a run lives on disk: the one owner of every path.

    results/<sweep>/                         SweepDir(root)
        configs/<run_id>.yaml                  .run_config(run_id): the job's input config
        runs/<run_id>/                         .run(run_id) -> RunDir
        initial/eval/step_0/<bench>.json       .initial: the initial model's evaluation
        model/                                 .model: the tiny model the workflow builds
        logs/<kind>/...log                     .log(...): one log per job
        benchmarks/<kind>/...tsv               .benchmark(...): Snakemake's job timings
        mlflow.db, mlflow_parent_run_id        .mlflow_db, .parent_run_id
        audit/, paper/, report.md              .audit, .paper, .report
        tables/, plots/                        .tables, .plots: the report's tables and plots
        tables/problem_scores.csv.gz           .problem_scores: every per-problem score the
                                               report's intervals read (a snapshot ships it)
        tables/initial_metrics.csv             .initial_metrics: the initial model's (step 0)
                                               evaluation summaries, the verdict's warm start
        crosscheck/                            .crosscheck -> CrosscheckDir (eval.crosscheck)
    <results_dir>/envs/<name>/               env_dir(results_dir, name): shared by sweeps
    <results_dir>/models/<name>/             prepared_model_dir(results_dir, name): a named
                                               pretrained model, converted once (trainer.pretrained)

    runs/<run_id>/                           RunDir(root)
        config.yaml                            .config: the resolved run config
        metrics.jsonl                          .metrics: one JSON object per step
        checkpoints/step_<N>/                  .checkpoint(N): HF weights + tokenizer
        checkpoints/step_<N>.tmp/              .checkpoint_tmp(N): written, then renamed
        state/resume.pt                        .state_file: the resume state
        eval/step_<N>/<bench>.json(l)          .eval_summary(N, b), .eval_samples(N, b)
        mlflow_run_id, mlflow_pending          .mlflow_run_id, .mlflow_pending
        DONE                                   .done: written last, the run is complete
        job_times.json                         .job_times: where its job's time went
                                               (python -m sweep.job; perf/main_job_profile.py)

    crosscheck/                              CrosscheckDir(root)
        benchmarks/<bench>/<bench>.jsonl       .benchmark(b): the problems lighteval reads
        lighteval/<run_id>/step_<N>/<bench>.json   .summary(run, N, b) (.results(...): its own)
        concordance.md, concordance.csv        .concordance_md, .concordance_csv

A checkpoint is complete exactly when `checkpoint(N)` exists: it is written under
`checkpoint_tmp(N)` and renamed. Every function takes `int | str` for steps and ids, so the
workflow rules build their wildcard patterns from the same functions:
`str(SweepDir(OUT).run("{run_id}").done)` is `<OUT>/runs/{run_id}/DONE`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
DONE = "DONE"
JOB_TIMES = "job_times.json"
RUN_ID_FILE = "mlflow_run_id"
PENDING_FILE = "mlflow_pending"
STATE_FILE = "resume.pt"
CHECKPOINT_CONFIG = "run_config.yaml"  # inside each checkpoint: the config that made it
INITIAL_DIR = "initial"
STEP_DIR = re.compile(r"step_(\d+)")


def step_name(step: int | str) -> str:
    """`step_<N>`: the folder name of step N (checkpoints and evaluations)."""
    return f"step_{step}"


def parse_step(name: str) -> int | None:
    """N for a folder named `step_<N>`, else None."""
    m = STEP_DIR.fullmatch(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class _Dir:
    """A directory whose layout the subclass names; `str()` is its path."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))  # accept str too

    def __str__(self) -> str:
        return str(self.root)


@dataclass(frozen=True)
class RunDir(_Dir):
    """The directory of one training run (or of the initial model's evaluations)."""

    @property
    def sweep(self) -> SweepDir:
        """The sweep this run belongs to: `<sweep>/runs/<run_id>` (absolute)."""
        return SweepDir(self.root.resolve().parent.parent)

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def done(self) -> Path:
        return self.root / DONE

    @property
    def job_times(self) -> Path:
        return self.root / JOB_TIMES

    @property
    def mlflow_run_id(self) -> Path:
        return self.root / RUN_ID_FILE

    @property
    def mlflow_pending(self) -> Path:
        return self.root / PENDING_FILE

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def state_file(self) -> Path:
        return self.state_dir / STATE_FILE

    def segment(self, step: int | str) -> Path:
        """Written when a training segment (`python -m trainer --until-step N`) reached N."""
        return self.root / "segments" / step_name(step)

    def state_tensors(self, step: int) -> Path:
        """The sharded weights and optimizer states (DCP) that `state_file` points at."""
        return self.state_dir / f"tensors_{step_name(step)}"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint(self, step: int | str) -> Path:
        return self.checkpoints / step_name(step)

    def checkpoint_tmp(self, step: int | str) -> Path:
        return self.checkpoints / (step_name(step) + ".tmp")

    @property
    def eval_root(self) -> Path:
        return self.root / "eval"

    def eval_dir(self, step: int | str) -> Path:
        return self.eval_root / step_name(step)

    def eval_summary(self, step: int | str, bench: str) -> Path:
        return self.eval_dir(step) / f"{bench}.json"

    def eval_samples(self, step: int | str, bench: str) -> Path:
        return self.eval_dir(step) / f"{bench}.jsonl"

    def eval_steps(self) -> list[tuple[int, Path]]:
        """(step, folder) of every `eval/step_<N>/` present, by step."""
        if not self.eval_root.is_dir():
            return []
        found = [(parse_step(d.name), d) for d in self.eval_root.iterdir() if d.is_dir()]
        return sorted((s, d) for s, d in found if s is not None)


@dataclass(frozen=True)
class SweepDir(_Dir):
    """The output directory of one sweep, `<results_dir>/<name>`."""

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    def run(self, run_id: str) -> RunDir:
        return RunDir(self.runs / run_id)

    def run_dirs(self) -> list[RunDir]:
        """Every run directory present, by name."""
        if not self.runs.is_dir():
            return []
        return [RunDir(d) for d in sorted(self.runs.iterdir()) if d.is_dir()]

    def run_config(self, run_id: str) -> Path:
        return self.root / "configs" / f"{run_id}.yaml"

    @property
    def initial(self) -> RunDir:
        """The initial model's evaluations (step 0), laid out like a run's."""
        return RunDir(self.root / INITIAL_DIR)

    @property
    def model(self) -> Path:
        return self.root / "model"

    def log(self, *parts: str) -> Path:
        """`logs/<parts...>.log`, e.g. log("train", run_id)."""
        return self.root.joinpath("logs", *parts[:-1], f"{parts[-1]}.log")

    def benchmark(self, *parts: str) -> Path:
        """`benchmarks/<parts...>.tsv`: Snakemake's timing of one job."""
        return self.root.joinpath("benchmarks", *parts[:-1], f"{parts[-1]}.tsv")

    @property
    def mlflow_db(self) -> Path:
        return self.root / "mlflow.db"

    @property
    def parent_run_id(self) -> Path:
        return self.root / "mlflow_parent_run_id"

    def sync_stamp(self, digest: str) -> Path:
        return self.root / "logs" / "mlflow_sync" / f"{digest}.done"

    @property
    def audit(self) -> Path:
        return self.root / "audit"

    @property
    def paper(self) -> Path:
        return self.root / "paper"

    @property
    def report(self) -> Path:
        return self.root / "report.md"

    @property
    def tables(self) -> Path:
        return self.root / "tables"

    @property
    def problem_scores(self) -> Path:
        return self.tables / "problem_scores.csv.gz"

    @property
    def initial_metrics(self) -> Path:
        return self.tables / "initial_metrics.csv"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def crosscheck(self) -> CrosscheckDir:
        return CrosscheckDir(self.root / "crosscheck")


@dataclass(frozen=True)
class CrosscheckDir(_Dir):
    """The cross-check stage's files: lighteval's inputs and outputs and the concordance."""

    def benchmark(self, bench: str) -> Path:
        return self.root / "benchmarks" / bench / f"{bench}.jsonl"

    @property
    def lighteval(self) -> Path:
        return self.root / "lighteval"

    def step_dir(self, run_id: str, step: int | str) -> Path:
        return self.lighteval / run_id / step_name(step)

    def summary(self, run_id: str, step: int | str, bench: str) -> Path:
        """lighteval's result converted to our summary format (`<bench>.json`)."""
        return self.step_dir(run_id, step) / f"{bench}.json"

    def results(self, run_id: str, step: int | str, bench: str) -> Path:
        """lighteval's own results file, converted into `summary(...)`."""
        return self.step_dir(run_id, step) / f"{bench}.results.json"

    def summaries(self) -> list[tuple[str, int, str, Path]]:
        """(run_id, step, bench, path) of every converted summary present, sorted by path."""
        found = []
        for path in sorted(self.lighteval.glob("*/step_*/*.json")):
            step = parse_step(path.parent.name)
            if step is not None and not path.name.endswith(".results.json"):
                found.append((path.parent.parent.name, step, path.stem, path))
        return found

    @property
    def concordance_md(self) -> Path:
        return self.root / "concordance.md"

    @property
    def concordance_csv(self) -> Path:
        return self.root / "concordance.csv"


def env_dir(results_dir: str | Path, name: str) -> Path:
    """`<results_dir>/envs/<name>`: an environment every sweep under results_dir shares."""
    return Path(results_dir) / "envs" / name


def prepared_model_dir(results_dir: str | Path, name: str) -> Path:
    """`<results_dir>/models/<name>`: a named pretrained model (trainer.pretrained), converted
    once and read by every sweep under results_dir."""
    return Path(results_dir) / "models" / name
