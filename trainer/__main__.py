"""Trainer CLI.

    python -m trainer --config run.yaml                 # train (or resume) one run
    python -m trainer train --config run.yaml           # same
    python -m trainer tiny --out DIR [--sft-steps N]    # build + warm-start the tiny model
                                                        # (options: trainer.tiny.TinyConfig)
    python -m trainer prepare smollm2-135m-instruct --out DIR   # a real model, offline
                                                        # (trainer.pretrained)
    python -m trainer heldout --model DIR [--n 4 | --greedy]   # toy held-out accuracy

Exit codes: 0 done (or stopped by debug.stop_after_steps), 2 bad config, an unloadable
model.path or a refused resume state, 74 the disk filled while saving (partial files removed,
the previous state whole: free space and rerun), 75 preempted (SIGTERM/SIGUSR1: resume state
saved, or nothing to save during set-up; rerun the same command to continue), 129 SIGHUP and
130 SIGINT (the state saved last is whole), 1 other errors (a traceback, then one line
"error: <cause>"). Every exit ends the rollout worker and removes its hand-off files
(docs/reliability.md "Faults on the async and distributed path").
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path


def _train(args) -> int:
    from trainer.config import check_model_path, load_run_config
    from trainer.deadline import job_deadline

    # Every input is checked before the (slow) import of the loop and before anything is
    # written: a bad config leaves no run directory behind.
    try:
        cfg = load_run_config(args.config)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        check_model_path(cfg.model.path)
    except ValueError as e:
        print(f"error: {args.config}: {e}", file=sys.stderr)
        return 2
    local = Path(cfg.model.path).expanduser()
    if local.is_dir():  # the weights' headers and shapes, before any load (a hub id: later)
        from common.generation.base import check_checkpoint

        try:
            check_checkpoint(local)
        except ValueError as e:
            print(f"error: {args.config}: model.path: {e}", file=sys.stderr)
            return 2
    try:
        deadline = job_deadline(args.deadline)
    except ValueError as e:
        print(f"error: --deadline: {e}", file=sys.stderr)
        return 2
    from trainer.distributed import check_torch

    try:
        check_torch(int(os.environ.get("WORLD_SIZE", "1")))  # torchrun's ranks
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.until_step is not None and not 1 <= args.until_step <= cfg.optim.steps:
        print(f"error: --until-step {args.until_step} must lie in 1..optim.steps "
              f"({cfg.optim.steps})", file=sys.stderr)
        return 2
    from common.files import read_run_id
    from trainer import distributed
    from trainer.checkpoint import (
        DISK_FULL_EXIT_CODE,
        DiskFullError,
        Stopped,
        UnsafeStateError,
        signals_stop_the_run,
    )
    from trainer.loop import train

    if cfg.rollout.mode == "async":
        from trainer.async_rollout import split_cpu_threads

        split_cpu_threads(cfg)
    parent = read_run_id(args.parent_run_id_file)  # the sweep's parent run, if any
    if parent and not cfg.tracking.parent_run_id:
        cfg.tracking.parent_run_id = parent
    try:
        with signals_stop_the_run():
            out = train(cfg, deadline=deadline, until_step=args.until_step)
    except UnsafeStateError as e:  # a resume file that would need unpickling: refused
        print(f"error: {e}", file=sys.stderr)
        return 2
    except DiskFullError as e:  # partial files removed, the previous state whole
        print(f"error: {e}", file=sys.stderr)
        return DISK_FULL_EXIT_CODE
    except Stopped as e:  # a signal outside a step: every child ended on the way out
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("error: interrupted (SIGINT); the resume state saved last (if any) is whole, "
              "rerun to resume", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the traceback, then the cause in one line
        traceback.print_exc()
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 1
    finally:
        distributed.shutdown()
    print(f"[trainer] run directory: {out}")
    return 0


def one_line(e: BaseException) -> str:
    """An error's cause in one line: its type and first line, and where the message runs
    over several lines (a relayed traceback) its last one, which names the cause."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if len(lines) > 1:
        text += f" ... {lines[-1]}"
    return f"{type(e).__name__}: {text}"


def _tiny(args) -> int:
    from trainer.tiny import TinyConfig, build_tiny

    overrides = {k: getattr(args, k) for k in TinyConfig.model_fields
                 if getattr(args, k) is not None}
    try:
        cfg = TinyConfig(**overrides)
    except ValueError as e:
        print(f"error: python -m trainer tiny: {e}", file=sys.stderr)
        return 2
    build_tiny(args.out, cfg)
    return 0


def _prepare(args) -> int:
    from trainer.pretrained import PREPARED, prepare

    if args.name not in PREPARED:
        print(f"error: python -m trainer prepare: unknown model {args.name!r}; choose one of "
              f"{sorted(PREPARED)}", file=sys.stderr)
        return 2
    try:
        out = prepare(args.name, args.out)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"prepared {args.name} in {out}")
    return 0


def _add_model_options(parser: argparse.ArgumentParser, model) -> None:
    """One `--field-name` option per field of a pydantic model: the model stays the one
    owner of names, types, defaults and help; an option left out keeps the model's default."""
    for name, field in model.model_fields.items():
        help_text = f"{field.description or name} (default {field.default})"
        parser.add_argument(f"--{name.replace('_', '-')}", type=field.annotation, default=None,
                            help=help_text)


def _heldout(args) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common import toy
    from trainer.config import RolloutConfig
    from trainer.heldout import heldout_accuracy
    from trainer.runtime import tune_cpu_runtime

    tune_cpu_runtime()
    model = AutoModelForCausalLM.from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    n, temperature = (1, 0.0) if args.greedy else (args.n, 1.0)
    acc = heldout_accuracy(model, tokenizer, toy.problems("test", args.problems, seed=0), n=n,
                           temperature=temperature,
                           max_new_tokens=(args.max_new_tokens
                                           or RolloutConfig.model_fields["max_new_tokens"].default))
    kind = "greedy" if args.greedy else f"sampled mean@{n} (T=1.0)"
    print(f"held-out accuracy ({kind}, {args.problems} toy test problems): {acc:.4f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].startswith("--") and argv[0] != "--help":  # `-m trainer --config x`
        argv = ["train", *argv]
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train or resume one run")
    p.add_argument("--config", required=True, help="run config YAML (trainer.config.RunConfig)")
    p.add_argument("--until-step", type=int, default=None,
                   help="train one segment: up to this step, then save the state and write "
                   "segments/step_N (the workflow evaluates its checkpoint meanwhile)")
    p.add_argument("--deadline", default=None,
                   help="the job's end (epoch seconds or ISO 8601; default: SLURM_JOB_END_TIME)"
                   ": save and exit 75 before a step that would not finish")
    p.add_argument("--parent-run-id-file", default=None,
                   help="file holding an MLflow parent run id (the sweep's); missing/empty: none")
    p.set_defaults(func=_train)
    p = sub.add_parser("tiny", help="build the tiny model + tokenizer and warm-start it")
    p.add_argument("--out", required=True, help="output directory (HF format)")
    if argv[:1] == ["tiny"]:  # trainer.tiny imports torch: only when it is the command
        from trainer.tiny import TinyConfig

        _add_model_options(p, TinyConfig)
    p.set_defaults(func=_tiny)
    p = sub.add_parser("prepare", help="convert a named pretrained model into an HF folder")
    p.add_argument("name", help="a trainer.pretrained name, e.g. smollm2-135m-instruct")
    p.add_argument("--out", required=True, help="output directory (HF format)")
    p.set_defaults(func=_prepare)
    p = sub.add_parser("heldout", help="held-out accuracy on the toy test split")
    p.add_argument("--model", required=True)
    p.add_argument("--n", type=int, default=4, help="samples per problem (temperature 1.0)")
    p.add_argument("--greedy", action="store_true")
    p.add_argument("--problems", type=int, default=121, help="held-out problems (121: all)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="default: the run config's rollout.max_new_tokens default")
    p.set_defaults(func=_heldout)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    from common.console import line_buffered_stdout, quick_teardown

    quick_teardown()  # registered first: its exit handler runs last
    line_buffered_stdout()  # its log shows each line when printed
    sys.exit(main())
