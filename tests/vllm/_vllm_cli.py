"""Helpers for the real-vLLM tests (a uniquely named module: importable from any subset)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def run_cli(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> str:
    """`python -m <args>` in a fresh process (`env`: variables added to this one's); fails
    the test with its output on error."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
           **(env or {})}
    proc = subprocess.run([sys.executable, "-m", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"python -m {' '.join(args)} exited {proc.returncode}:\n"
                    f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc.stdout + proc.stderr
