"""Helpers for the workflow tests: run Snakemake from the repository root, as a user would.

A module of its own (not conftest) so that tests import it by a name no other test folder uses.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCHMARK_DIR = REPO / "data" / "benchmarks"


def snakemake_exe() -> str:
    """The snakemake next to this interpreter (the project's venv), else the one on PATH."""
    local = Path(sys.executable).with_name("snakemake")
    return str(local) if local.exists() else shutil.which("snakemake")


def run_snakemake(*args, cwd=REPO, timeout=600, check=True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([snakemake_exe(), *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc
