"""The cross-check rules in the DAG: exact job counts per eval.crosscheck setting, and bad
settings rejected before any job, naming the key. (The default sweep without the overlay,
with none of these jobs, is pinned in tests/workflow/test_workflow_dryrun.py.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))
from test_workflow_dryrun import job_counts  # noqa: E402
from workflow_helpers import REPO, run_snakemake  # noqa: E402

# The default's train jobs evaluate their runs (eval.group: train): no evaluate_run jobs; a
# cell's 3 seeds train in one job (resources.train.seeds_together).
DEFAULT = {"tiny_model": 1, "evaluate_initial": 1, "run_config": 18, "train": 6,
           "audit": 1, "paper_figures": 1, "report": 1, "all": 1}
# 18 runs (6 methods x 3 seeds) x 2 benchmarks per cross-checked step; one env, one export
# per benchmark.
STAGE = {"lighteval_env": 1, "crosscheck_benchmark": 2, "concordance": 1}


def _dry_run(tmp_path, *files, overlay=None):
    args = ["--configfile", "config/default.yaml", *files]
    if overlay is not None:
        path = tmp_path / "overlay.yaml"
        path.write_text(yaml.safe_dump(overlay))
        args.append(str(path))
    return run_snakemake("-n", "-c", "2", "--directory", str(REPO), *args,
                         "--config", f"results_dir={tmp_path}", check=False)


@pytest.mark.parametrize(("overlay", "lighteval_jobs"), [
    (None, 36),                                        # last step only (the default)
    ({"eval": {"crosscheck_steps": "all"}}, 144),      # 4 steps
    ({"eval": {"crosscheck_steps": [20, 40]}}, 72),
])
def test_crosscheck_job_counts(tmp_path, overlay, lighteval_jobs):
    proc = _dry_run(tmp_path, "config/ablations/crosscheck.yaml", overlay=overlay)
    assert proc.returncode == 0, proc.stderr
    expected = {**DEFAULT, **STAGE, "lighteval": lighteval_jobs,
                "lighteval_summary": lighteval_jobs}
    assert job_counts(proc.stdout) == expected


def test_built_env_is_reused(tmp_path):
    """The environment is built once per results_dir and backend, not per sweep."""
    (tmp_path / "envs" / "lighteval-hf" / "bin").mkdir(parents=True)
    proc = _dry_run(tmp_path, "config/ablations/crosscheck.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "lighteval_env" not in job_counts(proc.stdout)


@pytest.mark.parametrize(("overlay", "needle"), [
    ({"eval": {"crosscheck": ["lm_eval"]}}, "eval.crosscheck.0"),
    ({"eval": {"crosscheck": ["lighteval"], "crosscheck_steps": [35]}},
     "eval.crosscheck_steps names [35], which eval.steps [10, 20, 30, 40] does not list"),
])
def test_bad_crosscheck_fails_before_any_job(tmp_path, overlay, needle):
    proc = _dry_run(tmp_path, overlay=overlay)
    assert proc.returncode != 0
    assert needle in proc.stderr and str(tmp_path / "overlay.yaml") in proc.stderr
    assert "Job stats" not in proc.stdout
