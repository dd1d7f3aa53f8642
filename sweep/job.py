"""One run's training, then the evaluation of its checkpoints, in one Python process.

    python -m sweep.job --config RUN.yaml [--parent-run-id-file F] -- EVAL_ARGS...
    python -m sweep.job --runs RUNS.json      # several runs, one after another

`eval.group: train` runs each run's evaluation this way: the job imports torch,
transformers and MLflow and opens the MLflow store once instead of twice (a train job and an
evaluation job each paid ~10 s of that on a 2-core laptop, a sixth of a tiny run's cost).
The two halves are the unchanged CLIs: `python -m trainer train` with the arguments before
`--`, then, only when it returns 0 with the run DONE, `python -m eval` with those after it.
The exit code is the trainer's when training did not finish (2 bad config, 74 disk full, 75
preempted: a rerun resumes and then evaluates), else the evaluation's. Single-process
training only: under torchrun every rank would evaluate (the sweep refuses that pairing).

`--runs` (`resources.train.seeds_together`: a cell's seeds in one job) takes a JSON list of
`{"log": PATH, "train": [TRAINER ARGS], "eval": [EVAL ARGS] or null}` and runs them in order
in this process, each with its stdout and stderr in its own log (file descriptors 1 and 2,
so the processes it starts write there too): the imports, the MLflow store and the grader's
pool are paid once per job. The numbers are the separate processes' (every run seeds
itself; tests/sweep/test_job.py compares them). The first run that fails ends the job
with its exit code. Snakemake then removes the job's outputs, the DONE markers of the runs
that finished before it included, so a rerun trains those again: seconds for a tiny run,
which is why only the laptop's default turns this on.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import ClassVar

from common.files import write_atomic
from common.layout import RunDir
from common.processes import seconds_since_start


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(trainer arguments, evaluation arguments), split at the first `--`."""
    if "--" not in argv:
        raise ValueError("python -m sweep.job: put the evaluation's arguments after `--` "
                         "(python -m sweep.job --config RUN.yaml -- --checkpoint ...)")
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def _exit_code(stop: SystemExit) -> int:
    """The code a process would exit with on `stop` (its message printed as Python would)."""
    if stop.code is None or isinstance(stop.code, int):
        return stop.code or 0
    print(stop.code, file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--runs"]:
        return run_several(argv[1:])
    try:
        train_argv, eval_argv = split_argv(argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return train_then_evaluate(train_argv, eval_argv)


def parse_runs(argv: list[str]) -> list[dict]:
    """`--runs`'s JSON list, each entry checked (a usage error names the bad one)."""
    if len(argv) != 1:
        raise ValueError("python -m sweep.job --runs takes one JSON list of "
                         '{"log": ..., "train": [...], "eval": [...] or null}')
    try:
        runs = json.loads(argv[0])
    except json.JSONDecodeError as e:
        raise ValueError(f"--runs: not JSON ({e})") from None
    if not isinstance(runs, list) or not runs:
        raise ValueError("--runs: expected a non-empty JSON list of runs")
    for i, run in enumerate(runs):
        if (not isinstance(run, dict) or set(run) != {"log", "train", "eval"}
                or not isinstance(run["train"], list)
                or not isinstance(run["eval"], (list, type(None)))):
            raise ValueError(f'--runs[{i}]: expected {{"log": PATH, "train": [ARGS], '
                             f'"eval": [ARGS] or null}}, got {run!r}')
    return runs


def run_several(argv: list[str]) -> int:
    """Each run of `--runs` in this process, in order, its output in its own log; the
    first failure's exit code ends the job."""
    try:
        runs = parse_runs(argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for run in runs:
        with output_to(run["log"]):
            code = train_then_evaluate(run["train"], run["eval"])
        if code != 0:
            print(f"error: {run['log']}: exit {code}; the job stops here", file=sys.stderr)
            return code
    return 0


@contextlib.contextmanager
def output_to(log: str):
    """stdout and stderr, file descriptors included, into `log` (truncated) for the block."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)


def _code_of(call) -> int:
    try:
        return call()
    except SystemExit as stop:  # the trainer's Preempted (75) leaves it this way
        return _exit_code(stop)


def train_then_evaluate(train_argv: list[str], eval_argv: list[str] | None) -> int:
    """The trainer with `train_argv`, then, once the run is DONE, the evaluation (none when
    `eval_argv` is None). Writes the run's `job_times.json` (`JobTimes`)."""
    enter, age = time.perf_counter(), seconds_since_start()
    import eval.run  # noqa: F401  (the heavy imports, timed here as the start-up)
    import trainer.loop  # noqa: F401
    from eval.__main__ import main as evaluate
    from trainer.__main__ import main as train
    from trainer.config import load_run_config

    imported = time.perf_counter()
    times = JobTimes(start_up_s=imported - enter + (0.0 if JobTimes.started else age or 0.0))
    JobTimes.started = True
    code = _code_of(lambda: train(["train", *train_argv]))
    times.train_s = time.perf_counter() - imported
    if code != 0:
        return code
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--config")
    config = parser.parse_known_args(train_argv)[0].config  # the trainer required it
    run = RunDir(load_run_config(config).out_dir)
    if not run.done.is_file():
        print(f"error: {config}: training returned without DONE (debug.stop_after_steps?): "
              "nothing to evaluate yet", file=sys.stderr)
        return 1
    if eval_argv is not None:
        clock = time.perf_counter()
        code = evaluate(eval_argv)
        times.eval_s = time.perf_counter() - clock
    times.write(run.job_times)
    return code


@dataclasses.dataclass
class JobTimes:
    """Where a run's job spent its wall time, for `perf/main_job_profile.py`: the process's
    start-up (interpreter, imports; 0 for a later run of a `--runs` job, which shares the
    first one's), the trainer's call (set-up, steps, checkpoints, MLflow; the steps' own
    share is metrics.jsonl's time_step) and the evaluation."""

    start_up_s: float = 0.0
    train_s: float = 0.0
    eval_s: float = 0.0
    started: ClassVar[bool] = False  # a run of this process has begun (start-up paid)

    def write(self, path: Path) -> None:
        write_atomic(path, json.dumps(dataclasses.asdict(self), indent=1) + "\n")


if __name__ == "__main__":
    from common.console import line_buffered_stdout, quick_teardown

    quick_teardown()  # registered first: its exit handler runs last
    line_buffered_stdout()  # its log shows each line when printed
    sys.exit(main())
