"""The cross-check stage's two ends in the project's environment: export a benchmark for
lighteval, and convert lighteval's results JSON into our evaluation summary schema.

    python -m eval.lighteval_convert export --benchmark toy [--benchmark-file F] \\
        [--limit N] --template dapo --out DIR/toy.jsonl
    python -m eval.lighteval_convert convert RESULTS.json --out summary.json \\
        [--benchmark toy] [--step 100] [--benchmark-file DIR/toy.jsonl] [--template dapo]
    python -m eval convert-lighteval RESULTS.json --out summary.json   # the same convert
    python -m eval.lighteval_convert build-env --requirements workflow/envs/lighteval-hf.txt \\
        --out results/envs/lighteval-hf

`export` writes the problems `python -m eval` loads (same file or generator, same limit)
with the user message already rendered by our template, so lighteval (eval/lighteval/run.py,
in its own environment) sees the same problems and prompts.

lighteval scores with its own copy of math-verify, so its numbers land under the scorer
name ``lighteval_math_verify``; compare them with our ``math_verify`` numbers on the same
checkpoint. Metric names understood (lighteval >= 0.10 and the older spelling):
``avg@n:n=32`` and ``math_pass@1:32_samples`` -> ``mean``; ``pass@k:k=4&n=32`` ->
``pass_at_4``; ``maj@k:k=4&n=32`` -> ``maj_at_4``; a ``_stderr`` suffix on the mean ->
``mean_stderr``. What lighteval does not report (confidence interval, extraction and
timeout rates, truncation, problem count, weights hash) is null; other metrics are kept
verbatim under ``lighteval_other``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import venv
from pathlib import Path

from common.files import write_atomic
from common.prompts import render
from eval.benchmarks import load_benchmark

SCORER = "lighteval_math_verify"
_MEAN = (re.compile(r"avg@n:n=(\d+)"), re.compile(r"(?:math_)?pass@1:(\d+)_samples"))
_PASS = re.compile(r"(?:math_)?pass@k:k=(\d+)&n=(\d+)")
_MAJ = re.compile(r"(?:math_)?maj@k:k=(\d+)&n=(\d+)|maj@(\d+)")


def _benchmark_of(task_key: str) -> str:
    """ "aime24_local|0" / "custom|aime24|0" / "lighteval|aime24|0" -> "aime24"."""
    parts = [p for p in task_key.split("|") if p and not p.isdigit()]
    parts = [p for p in parts if p not in ("custom", "lighteval", "community", "extended")]
    name = parts[0] if parts else task_key
    return name.removesuffix("_local")


def _scorer_metrics(values: dict) -> tuple[dict, dict, int | None]:
    """(scorer dict in our keys, unrecognised metrics, n samples if stated)."""
    ours: dict[str, float | None] = {
        "mean": None,
        "mean_stderr": None,
        "mean_ci95_low": None,
        "mean_ci95_high": None,
    }
    other: dict[str, float] = {}
    n: int | None = None
    for name, value in values.items():
        stderr = name.endswith("_stderr")
        base = name.removesuffix("_stderr")
        mean = next((m for m in (p.fullmatch(base) for p in _MEAN) if m), None)
        if mean:
            n = int(mean.group(1))
            ours["mean_stderr" if stderr else "mean"] = value
        elif (m := _PASS.fullmatch(base)) and not stderr:
            ours[f"pass_at_{m.group(1)}"] = value
            n = int(m.group(2))
        elif (m := _MAJ.fullmatch(base)) and not stderr:
            ours[f"maj_at_{m.group(1) or m.group(3)}"] = value
        else:
            other[name] = value
    ours.update(extract_fail_rate=None, timeout_rate=None)
    return ours, other, n


def convert(results: dict, benchmark: str | None = None, step: int | None = None) -> dict:
    """Summary dict (our schema) for one task of a lighteval results dict."""
    if not isinstance(results.get("results"), dict) or "config_general" not in results:
        raise ValueError(
            "not a lighteval results file: expected top-level keys 'results' and "
            f"'config_general', found {sorted(results)}"
        )
    tasks = {k: v for k, v in results["results"].items() if k != "all"}
    by_bench = {_benchmark_of(k): k for k in tasks}
    if benchmark is None:
        if len(by_bench) != 1:
            raise ValueError(f"results hold tasks {sorted(by_bench)}; choose one with --benchmark")
        benchmark = next(iter(by_bench))
    if benchmark not in by_bench:
        raise ValueError(f"benchmark={benchmark!r} not in the results; found {sorted(by_bench)}")
    key = by_bench[benchmark]
    scorer, other, n = _scorer_metrics(tasks[key])
    if scorer["mean"] is None:
        raise ValueError(
            f"task {key!r} reports no avg@n / pass@1 metric; found {sorted(tasks[key])}"
        )

    general = results["config_general"]
    model = general.get("model_config") or {}
    gen = model.get("generation_parameters") or {}
    task_cfg = (results.get("config_tasks") or {}).get(key) or {}
    repo = task_cfg.get("hf_repo")
    return {
        "benchmark": benchmark,
        "step": step,
        "checkpoint": model.get("model_name") or general.get("model_name"),
        "model_sha256": None,
        "source": {
            "kind": "local" if repo and repo.startswith(("/", ".")) else "hub",
            "path_or_id": repo,
            "sha256": None,
        },
        "sampling": {
            "backend": "vllm" if "gpu_memory_utilization" in model else "hf",
            "n": n,
            "temperature": gen.get("temperature"),
            "top_p": gen.get("top_p"),
            "max_new_tokens": gen.get("max_new_tokens") or task_cfg.get("generation_size"),
            "seed": gen.get("seed"),
            "template": None,
        },
        "num_problems": None,
        "truncation_rate": None,
        "scorers": {SCORER: scorer},
        "lighteval_other": other,
        "origin": {"tool": "lighteval", "task": key, "max_samples": general.get("max_samples")},
    }


def build_env(requirements: str | Path, out: str | Path) -> float:
    """Create lighteval's virtual environment at `out` from `requirements` (pip's output
    goes to stdout); returns its size in GiB. Offline-ready: lighteval downloads
    tinyBenchmarks.pkl when it loads its task registry unless the file exists, so an empty
    one is put in place. Raises RuntimeError with one line naming the file when pip fails."""
    requirements, out = Path(requirements), Path(out)
    if not requirements.is_file():
        raise FileNotFoundError(f"lighteval requirements {requirements} do not exist")
    venv.create(out, with_pip=True, clear=True)
    python = out / "bin" / "python"
    pip = subprocess.run([str(python), "-m", "pip", "install", "-r", str(requirements)],
                         stderr=subprocess.STDOUT, check=False)  # into the job log
    if pip.returncode != 0:
        raise RuntimeError(f"lighteval is not installable from {requirements} into {out} (pip "
                           f"exit {pip.returncode}; its output is in this job's log); fix the "
                           "pins there or reach a package index")
    subprocess.run([str(python), "-c", "import pathlib, lighteval; (pathlib.Path(lighteval."
                    "__file__).parent / 'tasks/tasks/tinyBenchmarks.pkl').touch()"], check=True)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file() and not f.is_symlink())
    return size / 2**30


def export_benchmark(name: str, out: str | Path, template: str, path: str | None = None,
                     limit: int | None = None) -> int:
    """Write benchmark `name` (as `python -m eval` loads it) as JSONL rows {id, problem,
    answer, query} to `out`, `query` being the user message under `template`; returns the
    number of problems."""
    bench = load_benchmark(name, path=path, limit=limit)
    lines = [json.dumps({**p, "query": render(p["problem"], template)}, ensure_ascii=False)
             for p in bench.problems]
    write_atomic(Path(out), "\n".join(lines) + "\n")
    return len(lines)


def convert_file(
    path: str | Path, out: str | Path, benchmark: str | None = None, step: int | None = None,
    benchmark_file: str | Path | None = None, template: str | None = None,
    checkpoint: str | None = None,
) -> dict:
    """Read lighteval's results JSON at `path`, write our summary to `out` atomically.

    With `benchmark_file` (the export lighteval read), the summary also records the number
    of problems and their content hash (`source.sha256`, comparable with ours)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"lighteval results file {path} does not exist")
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
    summary = convert(results, benchmark=benchmark, step=step)
    summary["origin"]["results_file"] = str(path)
    if benchmark_file is not None:
        source = load_benchmark(summary["benchmark"], path=benchmark_file).source
        summary["source"] = {**source, "kind": "local"}
        summary["num_problems"] = sum(1 for line in Path(benchmark_file).open() if line.strip())
    summary["sampling"]["template"] = template
    if checkpoint is not None:  # lighteval saw a view of it (eval/lighteval/run.py)
        summary["checkpoint"] = checkpoint
    write_atomic(Path(out), json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.lighteval_convert", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="a benchmark as lighteval's task reads it")
    ex.add_argument("--benchmark", required=True)
    ex.add_argument("--benchmark-file", default=None)
    ex.add_argument("--limit", type=int, default=None)
    ex.add_argument("--template", required=True)
    ex.add_argument("--out", required=True)
    cv = sub.add_parser("convert", help="lighteval results JSON -> our summary JSON")
    cv.add_argument("results")
    cv.add_argument("--out", required=True)
    cv.add_argument("--benchmark", default=None)
    cv.add_argument("--step", type=int, default=None)
    cv.add_argument("--benchmark-file", default=None, help="the export lighteval read")
    cv.add_argument("--template", default=None)
    cv.add_argument("--checkpoint", default=None, help="record this checkpoint path")
    env = sub.add_parser("build-env", help="lighteval's virtual environment from pinned pins")
    env.add_argument("--requirements", required=True)
    env.add_argument("--out", required=True)
    args = p.parse_args(argv)
    try:
        if args.cmd == "build-env":
            size = build_env(args.requirements, args.out)
            print(f"lighteval environment {args.out}: {size:.2f} GiB")
        elif args.cmd == "export":
            count = export_benchmark(args.benchmark, args.out, args.template,
                                     args.benchmark_file, args.limit)
            print(f"{args.benchmark}: {count} problems -> {args.out}")
        else:
            summary = convert_file(args.results, args.out, args.benchmark, args.step,
                                   args.benchmark_file, args.template, args.checkpoint)
            print(json.dumps(summary["scorers"], indent=2))
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
