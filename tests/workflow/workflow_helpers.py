"""Helpers for the workflow tests: run Snakemake from the repository root, as a user would.

A module of its own (not conftest) so that tests import it by a name no other test folder uses.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BENCHMARK_DIR = REPO / "data" / "benchmarks"


def snakemake_exe() -> str:
    """The snakemake next to this interpreter (the project's venv), else the one on PATH."""
    local = Path(sys.executable).with_name("snakemake")
    return str(local) if local.exists() else shutil.which("snakemake")


def run_snakemake(*args, cwd=REPO, timeout=600, check=True,
                  env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`snakemake *args` with this venv first on PATH; `env` adds variables."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           **(env or {})}
    proc = subprocess.run([snakemake_exe(), *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


STEPS = 4  # the micro sweep's training steps; evaluated at STEPS // 2 and STEPS


def micro_sweep(root: Path, name: str, methods: list[str], steps: int = STEPS,
                model: str = "tiny", initial_eval: bool = True) -> Path:
    """A sweep config: tiny model, a few steps, toy task and two AIME problems.
    model "tiny" is the shipped data/tiny-model, copied (no `tiny:` settings, so no build
    job: a build is minutes of CPU, tests/security's sweep runs one).
    initial_eval: also evaluate the initial model (eval.initial; one more eval job, worth it
    only for a test that reads the report's baseline row)."""
    cfg = {
        "name": name,
        "results_dir": str(root / "results"),
        "base": {
            "model": {"path": model},
            "task": {"kind": "toy", "num_prompts": 64},
            "rollout": {"n": 4, "prompts_per_step": 4, "max_new_tokens": 24},
            "optim": {"steps": steps},
            "checkpoint": {"state_every_steps": 1},
            "tracking": {"progress": False},
        },
        "methods": methods,
        "seeds": [0],
        "eval": {
            "steps": [steps // 2, steps],
            "benchmarks": ["toy", "aime24"],
            "n": 2,
            "max_new_tokens": 24,
            "limit": {"toy": 8, "aime24": 2},
            "files": {"aime24": str(BENCHMARK_DIR / "aime24.jsonl")},
            "initial": initial_eval,
        },
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def reuse_report_extras(finished_out: Path, sweep_out: Path) -> None:
    """Copy a finished sweep's audit/ and paper/ into another sweep's results folder. Their
    rules have no inputs and give the same files for every sweep (~1.5 min of CPU on CI's
    2 cores), so Snakemake keeps the copies; the finished sweep tests that it builds them."""
    for folder in ("audit", "paper"):
        shutil.copytree(finished_out / folder, sweep_out / folder)


def smk(root: Path, config: Path, *extra, check=True):
    """The Snakefile on `config`, run in `root` with two cores, as a user would."""
    return run_snakemake("--snakefile", str(REPO / "Snakefile"), "--directory", str(root),
                         "--configfile", str(config), "-c", "2", "--rerun-incomplete", *extra,
                         cwd=root, check=check, timeout=900)
