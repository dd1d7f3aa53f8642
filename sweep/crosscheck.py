"""Arguments of the cross-check stage's jobs (workflow/rules/crosscheck.smk), taken from the
sweep's eval settings so that lighteval sees what rule evaluate saw."""

from __future__ import annotations

import shlex

from .runconfig import run_dir
from .spec import SweepConfig


def crosscheck_export_args(sweep: SweepConfig, bench: str) -> str:
    """`python -m eval.lighteval_convert export` arguments: the benchmark exactly as rule
    evaluate loads it (same file or generator, same limit, same template)."""
    spec = sweep.eval
    args = ["--benchmark", bench, "--template", spec.template]
    if bench in spec.files:
        args += ["--benchmark-file", spec.files[bench]]
    if bench in spec.limit:
        args += ["--limit", str(spec.limit[bench])]
    return shlex.join(args)


def crosscheck_run_args(sweep: SweepConfig, run_id: str, step: int, bench: str) -> str:
    """eval/lighteval/run.py arguments: rule evaluate's checkpoint and sampling settings."""
    spec = sweep.eval
    return shlex.join([
        "--checkpoint", str(run_dir(sweep, run_id).checkpoint(step)),
        "--benchmark", bench, "--n", str(spec.n), "--temperature", str(spec.temperature),
        "--top-p", str(spec.top_p), "--max-new-tokens", str(spec.max_new_tokens),
        "--seed", str(spec.seed), "--backend", spec.backend,
    ])
