"""Command line: evaluate checkpoints on benchmarks, or convert lighteval results.

    python -m eval --checkpoint DIR --benchmark aime24 --n 32 --temperature 1.0 \\
        --top-p 1.0 --max-new-tokens 8192 --template dapo --backend vllm --out DIR
    python -m eval --checkpoint run/checkpoints/step_40 run/checkpoints/step_80 \\
        --benchmark toy aime24 --benchmark-file aime24=data/aime24.jsonl --limit aime24=5 \\
        --backend hf --out 'run/eval/step_{step}'
    python -m eval convert-lighteval RESULTS.json --out SUMMARY.json [--benchmark aime24]

`--out DIR` receives <benchmark>.jsonl (one record per sample) and <benchmark>.json (the
summary); with several checkpoints it must hold `{step}`, replaced by each checkpoint's
step. Several checkpoints and benchmarks share one engine start-up: the weights are swapped
per checkpoint, and the files are identical to evaluating each pair in its own process.
Defaults are EvalConfig's (eval/run.py), the choices the registries' (templates, scorers,
engines, benchmarks). Exit status 2 with a one-line message for bad input, before any
generation.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic import ValidationError

from common.files import read_run_id
from common.generation import ENGINES
from common.grading import SCORERS
from common.prompts import TEMPLATES
from eval.benchmarks import BENCHMARKS


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in _csv(text))


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"{text!r}: give true or false")
    return text.lower() == "true"


def eval_parser() -> argparse.ArgumentParser:
    from eval.run import EvalConfig  # the one owner of every default below

    def default(name: str):
        return EvalConfig.model_fields[name].get_default(call_default_factory=True)

    p = argparse.ArgumentParser(
        prog="python -m eval",
        description="Mean@n / pass@k / maj@k of checkpoints on math benchmarks, graded by "
        "the DAPO scorer and math-verify. Subcommand: convert-lighteval.",
    )
    p.add_argument("--checkpoint", required=True, nargs="+", action="extend",
                   help="HF checkpoint dir(s) (weights+tokenizer); several: one engine start-up")
    p.add_argument("--benchmark", required=True, nargs="+", action="extend",
                   choices=list(BENCHMARKS))
    p.add_argument("--out", required=True, help="output dir for <bench>.jsonl and <bench>.json;"
                   " with several checkpoints it holds {step}")
    p.add_argument("--n", type=int, default=default("n"), help="samples per problem (Mean@n)")
    p.add_argument("--temperature", type=float, default=default("temperature"))
    p.add_argument("--top-p", type=float, default=default("top_p"))
    p.add_argument("--max-new-tokens", type=int, default=default("max_new_tokens"))
    p.add_argument("--template", default=default("template"), choices=list(TEMPLATES),
                   help="default: the template the checkpoint's run trained with (its "
                   "run_config.yaml), else dapo; another than that one is refused")
    p.add_argument("--enable-thinking", type=_bool, default=default("enable_thinking"),
                   help="true/false: the chat template's thinking switch (Qwen3); default: "
                   "the checkpoint's run's task.chat.enable_thinking, else the template's own")
    p.add_argument("--backend", default=default("backend"), choices=list(ENGINES))
    p.add_argument("--seed", type=int, default=default("seed"))
    p.add_argument("--step", type=int, default=None,
                   help="training step (default: from step_N; one checkpoint only)")
    p.add_argument("--benchmark-file", action="append", default=[],
                   help="local JSONL/parquet instead of hub: PATH (one benchmark) or BENCH=PATH")
    p.add_argument("--scorers", type=_csv, default=default("scorers"),
                   help=f"comma list of {','.join(SCORERS)}")
    p.add_argument("--ks", type=_ints, default=None, help="pass@k/maj@k ks (default 1,2,4..n)")
    p.add_argument("--batch-size", type=int, default=default("batch_size"),
                   help="hf backend: rows per generate")
    p.add_argument("--limit", action="append", default=[],
                   help="first N problems only: N (every benchmark) or BENCH=N")
    p.add_argument("--limit-at", action="append", default=[],
                   help="STEP:BENCH=N: the checkpoint of STEP evaluates BENCH's first N "
                   "problems instead (a sweep's cheaper intermediate evaluations)")
    p.add_argument("--timeout-s", type=float, default=default("timeout_s"),
                   help="math_verify/item")
    p.add_argument("--device", default=default("device"), help="hf backend: cpu, cuda, auto")
    p.add_argument("--dtype", default=default("dtype"), help="auto, float32, bfloat16, float16")
    p.add_argument("--mlflow-uri", default=None)
    p.add_argument("--mlflow-run-id", default=None)
    p.add_argument("--mlflow-run-id-file", default=None,
                   help="read the run id from this file (the trainer writes <run>/mlflow_run_id);"
                   " with --mlflow-uri, a missing or empty file (training could not reach MLflow)"
                   " means no MLflow logging, noted in <run>/mlflow_pending for a later sync")
    p.add_argument("--greedy", action="store_true",
                   help="also one greedy answer per problem (temperature 0): each scorer's "
                   "summary gets `greedy`, its accuracy")
    p.add_argument("--no-kl", dest="kl", action="store_false",
                   help="skip the KL to the initial model named in each checkpoint's run config")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    return p


def per_benchmark(values: list[str], benchmarks: list[str], flag: str) -> dict[str, str]:
    """`--flag VALUE` (every benchmark) or `--flag BENCH=VALUE` (repeatable) -> bench: value."""
    out: dict[str, str] = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if sep and name in BENCHMARKS:
            if name not in benchmarks:
                raise ValueError(f"{flag} {value}: {name} is not among --benchmark {benchmarks}")
            out[name] = rest
        elif flag == "--benchmark-file" and len(benchmarks) > 1:
            raise ValueError(f"{flag} {value}: with several benchmarks write BENCH=PATH "
                             f"(one of {benchmarks})")
        else:
            out.update(dict.fromkeys(benchmarks, value))
    return out


def step_limits(values: list[str], benchmarks: list[str]) -> dict[tuple[int, str], str]:
    """`--limit-at STEP:BENCH=N` (repeatable) -> {(step, bench): N}."""
    out: dict[tuple[int, str], str] = {}
    for value in values:
        step, _, rest = value.partition(":")
        bench, sep, n = rest.partition("=")
        if not (step.isdigit() and sep and n.isdigit() and int(n) > 0):
            raise ValueError(f"--limit-at {value}: write STEP:BENCH=N (e.g. 10:arithmetic=40)")
        if bench not in benchmarks:
            raise ValueError(f"--limit-at {value}: {bench} is not among --benchmark {benchmarks}")
        out[(int(step), bench)] = n
    return out


def refuse_shell_quotes(flag: str, path: str) -> None:
    """A path that starts or ends with a quote was shell-quoted and then split without a
    shell (`shlex.join` output through `str.split`): taken literally it names a relative
    folder called `'/tmp/...'` in the working directory. One line names the flag and the fix."""
    if path and (path[0] in "'\"" or path[-1] in "'\""):
        raise ValueError(f"{flag} {path}: a shell-quoted path reached the command without a "
                         "shell; pass the argument list (sweep.runconfig.eval_argv) or "
                         "shlex.split the string")


def eval_configs(args: argparse.Namespace) -> list:
    """One EvalConfig per (checkpoint, benchmark), checkpoint-major (raises ValueError /
    pydantic ValidationError on bad input)."""
    from eval.run import EvalConfig, infer_step

    options = vars(args).copy()
    checkpoints = list(dict.fromkeys(options.pop("checkpoint")))
    benchmarks = list(dict.fromkeys(options.pop("benchmark")))
    files = per_benchmark(options.pop("benchmark_file"), benchmarks, "--benchmark-file")
    limits = per_benchmark(options.pop("limit"), benchmarks, "--limit")
    limit_at = step_limits(options.pop("limit_at"), benchmarks)
    out = options.pop("out")
    for flag, values in (("--out", [out]), ("--checkpoint", checkpoints),
                         ("--benchmark-file", list(files.values()))):
        for value in values:
            refuse_shell_quotes(flag, value)
    if len(checkpoints) > 1 and "{step}" not in out:
        raise ValueError(f"--out {out}: with {len(checkpoints)} checkpoints it must hold "
                         "{step} (e.g. run/eval/step_{step})")
    if len(checkpoints) > 1 and options["step"] is not None:
        raise ValueError("--step names one checkpoint's step; with several, each step comes "
                         "from its step_N directory")
    id_file = options.pop("mlflow_run_id_file")
    if id_file and not options["mlflow_run_id"]:
        options["mlflow_run_id"] = read_run_id(id_file)
        # the run directory: where a failed mirror is noted for `python -m sweep mlflow-sync`
        options["mlflow_pending_dir"] = str(Path(id_file).parent)
    configs = []
    steps = [options["step"] if options["step"] is not None else infer_step(c)
             for c in checkpoints]
    unknown = sorted({s for s, _ in limit_at} - set(steps))
    if unknown:
        raise ValueError(f"--limit-at names step(s) {unknown}, which no --checkpoint is "
                         f"(their steps: {steps})")
    for checkpoint, step in zip(checkpoints, steps):
        if "{step}" in out and step is None:
            raise ValueError(f"--out {out}: {checkpoint} is not a step_N directory; pass --step")
        for bench in benchmarks:
            limit = limit_at.get((step, bench), limits.get(bench))
            if limit is not None and not limit.lstrip("-").isdigit():
                raise ValueError(f"--limit {limit}: give an integer N or BENCH=N")
            configs.append(EvalConfig(
                **options, checkpoint=checkpoint, benchmark=bench,
                out=out.replace("{step}", str(step)), benchmark_file=files.get(bench),
                limit=int(limit) if limit is not None else None))
    return configs


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

    from eval.run import check_shared_engine, execute_all, prepare  # heavy: only to evaluate

    args = eval_parser().parse_args(argv)
    try:
        prepared = [prepare(cfg) for cfg in eval_configs(args)]
        check_shared_engine(prepared)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "config"
        print(f"error: {where}: {first['msg']}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for summary in execute_all(prepared):
        brief = {name: round(v["mean"], 4) for name, v in summary["scorers"].items()}
        print(f"{summary['benchmark']} step={summary['step']} mean@{args.n}: {brief}")
    return 0


if __name__ == "__main__":
    from common.console import line_buffered_stdout, quick_teardown

    quick_teardown()  # registered first: its exit handler runs last
    line_buffered_stdout()  # its log shows each line when printed
    sys.exit(main())
