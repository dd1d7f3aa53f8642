"""Command line: evaluate a checkpoint on a benchmark, or convert lighteval results.

    python -m eval --checkpoint DIR --benchmark aime24 --n 32 --temperature 1.0 \\
        --top-p 1.0 --max-new-tokens 8192 --template dapo --backend vllm --out DIR
    python -m eval --checkpoint DIR --benchmark aime24 --benchmark-file data/aime24.jsonl \\
        --n 4 --max-new-tokens 256 --backend hf --limit 5 --out /tmp/look
    python -m eval convert-lighteval RESULTS.json --out SUMMARY.json [--benchmark aime24]

`--out DIR` receives <benchmark>.jsonl (one record per sample) and <benchmark>.json (the
summary). Exit status 2 with a one-line message for bad input (before any generation).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic import ValidationError

from common.files import read_run_id
from eval.benchmarks import BENCHMARKS
from eval.grading import DEFAULT_TIMEOUT_S, SCORERS
from eval.prompts import TEMPLATES


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in _csv(text))


def eval_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m eval",
        description="Mean@n / pass@k / maj@k of a checkpoint on a math benchmark, graded by "
        "the DAPO scorer and math-verify. Subcommand: convert-lighteval.",
    )
    p.add_argument("--checkpoint", required=True, help="HF checkpoint dir (weights+tokenizer)")
    p.add_argument("--benchmark", required=True, choices=list(BENCHMARKS))
    p.add_argument("--out", required=True, help="output dir for <bench>.jsonl and <bench>.json")
    p.add_argument("--n", type=int, default=32, help="samples per problem (Mean@n)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=8192)
    p.add_argument("--template", default="dapo", choices=list(TEMPLATES))
    p.add_argument("--backend", default="hf", choices=["hf", "vllm"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step", type=int, default=None, help="training step (default: from step_N)")
    p.add_argument("--benchmark-file", default=None, help="local JSONL/parquet instead of hub")
    p.add_argument("--scorers", type=_csv, default=SCORERS, help="comma list: dapo,math_verify")
    p.add_argument("--ks", type=_ints, default=None, help="pass@k/maj@k ks (default 1,2,4..n)")
    p.add_argument("--batch-size", type=int, default=64, help="hf backend: rows per generate")
    p.add_argument("--limit", type=int, default=None, help="first N problems only")
    p.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, help="math_verify/item")
    p.add_argument("--device", default="auto", help="hf backend: cpu, cuda, auto")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    p.add_argument("--mlflow-uri", default=None)
    p.add_argument("--mlflow-run-id", default=None)
    p.add_argument("--mlflow-run-id-file", default=None,
                   help="read the run id from this file (the trainer writes <run>/mlflow_run_id);"
                   " with --mlflow-uri, a missing or empty file (training could not reach MLflow)"
                   " means no MLflow logging, noted in <run>/mlflow_pending for a later sync")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    return p


def convert_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m eval convert-lighteval",
        description="Convert a lighteval results JSON into our summary schema.",
    )
    p.add_argument("results", help="lighteval results_<time>.json")
    p.add_argument("--out", required=True, help="summary JSON to write")
    p.add_argument("--benchmark", default=None, help="task to take when the file holds several")
    p.add_argument("--step", type=int, default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["convert-lighteval"]:
        from eval.lighteval_convert import convert_file

        args = convert_parser().parse_args(argv[1:])
        try:
            summary = convert_file(args.results, args.out, args.benchmark, args.step)
        except (ValueError, FileNotFoundError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(json.dumps(summary["scorers"], indent=2))
        return 0

    from eval.run import EvalConfig, execute, prepare  # heavy imports only when evaluating

    args = eval_parser().parse_args(argv)
    options = vars(args)
    id_file = options.pop("mlflow_run_id_file")
    if id_file and not options["mlflow_run_id"]:
        options["mlflow_run_id"] = read_run_id(id_file)
        # the run directory: where a failed mirror is noted for `python -m sweep mlflow-sync`
        options["mlflow_pending_dir"] = str(Path(id_file).parent)
    try:
        prepared = prepare(EvalConfig(**options))
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "config"
        print(f"error: {where}: {first['msg']}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    summary = execute(prepared)
    brief = {name: round(v["mean"], 4) for name, v in summary["scorers"].items()}
    print(f"{summary['benchmark']} step={summary['step']} mean@{args.n}: {brief}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
