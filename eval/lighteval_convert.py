"""Convert a lighteval results JSON into our evaluation summary schema (cross-check).

    python -m eval convert-lighteval OUT/results/<model>/results_<time>.json \\
        --out summary.json [--benchmark aime24] [--step 40]

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

import json
import re
from pathlib import Path

from common.files import write_atomic

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


def convert_file(
    path: str | Path, out: str | Path, benchmark: str | None = None, step: int | None = None
) -> dict:
    """Read lighteval's results JSON at `path`, write our summary to `out` atomically."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"lighteval results file {path} does not exist")
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
    summary = convert(results, benchmark=benchmark, step=step)
    summary["origin"]["results_file"] = str(path)
    write_atomic(Path(out), json.dumps(summary, indent=2) + "\n")
    return summary
