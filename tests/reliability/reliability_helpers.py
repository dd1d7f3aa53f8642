"""Helpers of the fault drills: a tiny model, a micro sweep, Snakemake as a user runs it, a
read-only file and a port nobody listens on.

A module of its own (not conftest) so tests import it by a name no other test folder uses.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import yaml

from trainer.tiny import TinyConfig

REPO = Path(__file__).resolve().parents[2]
# Small but real: accuracy is not the point of the drills, surviving the fault is.
TINY = TinyConfig(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                  sft_steps=40, sft_batch_size=16, sft_lr=5e-3)


def closed_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def read_only(path: Path):
    """Make `path` unwritable, even for root: `chattr +i` (chmod does not stop root), or
    chmod when not root. Yields the method used; skips when neither can be applied."""
    path = Path(path)
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(stat.S_IRUSR)
        try:
            yield "chmod"
        finally:
            path.chmod(mode)
        return
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(path)],
                                        capture_output=True).returncode != 0:
        import pytest

        pytest.skip("running as root where `chattr +i` does not work on this filesystem: "
                    "no way to make a file read-only (the unreachable-server drills still run)")
    try:
        yield "chattr"
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True)


def snakemake(*args, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    """`snakemake --snakefile <repo>/Snakefile --directory cwd ...`, never raising."""
    exe = Path(sys.executable).with_name("snakemake")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([str(exe) if exe.exists() else "snakemake", "--snakefile",
                           str(REPO / "Snakefile"), "--directory", str(cwd), *args],
                          cwd=cwd, env=env, text=True, capture_output=True, timeout=timeout)


def micro_sweep(root: Path, model: Path, name: str = "micro", **overrides) -> Path:
    """A one-run sweep (GRPO, 2 steps, toy task, 4 problems at step 2) on a built model."""
    cfg = {
        "name": name,
        "results_dir": str(root / "results"),
        "base": {
            "model": {"path": str(model)},
            "task": {"kind": "toy", "num_prompts": 16},
            "rollout": {"n": 2, "prompts_per_step": 2, "max_new_tokens": 16,
                        "overlong_buffer": 4},
            "optim": {"steps": 2},
            "tracking": {"progress": False},
        },
        "methods": ["GRPO"],
        "eval": {"steps": [2], "benchmarks": ["toy"], "n": 1, "max_new_tokens": 16,
                 "limit": {"toy": 4}},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path
