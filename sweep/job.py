"""One run's training, then the evaluation of its checkpoints, in one Python process.

    python -m sweep.job --config RUN.yaml [--parent-run-id-file F] -- EVAL_ARGS...

`eval.group: train` runs each run's evaluation this way: the job imports torch,
transformers and MLflow and opens the MLflow store once instead of twice (a train job and an
evaluation job each paid ~10 s of that on a 2-core laptop, a sixth of a tiny run's cost).
The two halves are the unchanged CLIs: `python -m trainer train` with the arguments before
`--`, then, only when it returns 0 with the run DONE, `python -m eval` with those after it.
The exit code is the trainer's when training did not finish (2 bad config, 74 disk full, 75
preempted: a rerun resumes and then evaluates), else the evaluation's. Single-process
training only: under torchrun every rank would evaluate (the sweep refuses that pairing).
"""

from __future__ import annotations

import argparse
import sys

from common.layout import RunDir


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
    try:
        train_argv, eval_argv = split_argv(argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from eval.__main__ import main as evaluate
    from trainer.__main__ import main as train
    from trainer.config import load_run_config

    try:
        code = train(["train", *train_argv])
    except SystemExit as stop:  # the trainer's Preempted (75) leaves it this way
        code = _exit_code(stop)
    if code != 0:
        return code
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--config")
    config = parser.parse_known_args(train_argv)[0].config  # the trainer required it
    if not RunDir(load_run_config(config).out_dir).done.is_file():
        print(f"error: {config}: training returned without DONE (debug.stop_after_steps?): "
              "nothing to evaluate yet", file=sys.stderr)
        return 1
    return evaluate(eval_argv)


if __name__ == "__main__":
    from common.console import line_buffered_stdout

    line_buffered_stdout()  # its log shows each line when printed
    sys.exit(main())
