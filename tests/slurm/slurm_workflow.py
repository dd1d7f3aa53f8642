"""Run the workflow on the test cluster through the shipped SLURM profile, as a user would.

A module of its own (not conftest) so that tests import it by a name no other folder uses.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "workflow" / "profiles" / "slurm" / "config.yaml"
PARTITION = "debug"  # the test cluster's only partition


def profile_overlay(dest: Path, lead_s: int | None = None) -> Path:
    """The shipped profile with its placeholders filled in: partition `debug`, no account
    (the cluster has no accounting, so the plugin may not validate one). `lead_s` replaces
    the warning signal's lead, for a time-limit drill whose limits are a minute or two."""
    text = PROFILE.read_text()
    text = text.replace('"<ACCOUNT>"', '""').replace('"<PARTITION>"', f'"{PARTITION}"')
    left = re.findall(r'"<[A-Z_]+>"', text)
    assert not left, f"{PROFILE} has placeholders the test does not fill: {left}"
    if lead_s is not None:
        text, n = re.subn(r"(--signal=\w+@)\d+", rf"\g<1>{lead_s}", text)
        assert n == 1, f"{PROFILE}: expected one --signal=SIG@SECONDS in slurm_extra"
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.yaml").write_text(text)
    return dest


def micro_sweep(root: Path, name: str, *, model: str = "tiny", steps: int = 4,
                seeds: tuple[int, ...] = (0,), train_min: int = 10, train_gpus: int = 0,
                eval_limit: int = 8, step_seconds: float = 0.0) -> Path:
    """One method, `steps` steps, one evaluation (the last step, toy task) per seed, and no
    evaluation of the initial model (`eval.initial`: a SLURM job that would take the node's
    CPU from the drills' jobs, and no drill reads it).
    step_seconds: a floor on each step's duration (debug.sleep_per_step_s)."""
    cfg = {
        "name": name,
        "results_dir": str(root / "results"),
        "tiny": {"sft_steps": 10},  # the model's quality does not matter here, its speed does
        "base": {
            "model": {"path": model},
            "task": {"kind": "toy", "num_prompts": 64},
            "rollout": {"n": 4, "prompts_per_step": 4, "max_new_tokens": 24},
            "optim": {"steps": steps},
            "checkpoint": {"state_every_steps": 1},
            "tracking": {"progress": False},
            "debug": {"sleep_per_step_s": step_seconds},
        },
        "methods": ["RPG-REINFORCE-URKL"],
        "seeds": list(seeds),
        "eval": {"steps": [steps], "benchmarks": ["toy"], "n": 2, "max_new_tokens": 24,
                 "limit": {"toy": eval_limit}, "initial": False},
        "resources": {
            "train": {"gpus": train_gpus, "cpus": 1, "mem_mb": 2000, "runtime_min": train_min},
            "evaluate": {"cpus": 1, "mem_mb": 2000, "runtime_min": 10},
        },
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class Workflow:
    """`snakemake --profile <overlay>` for one sweep, run from its own directory."""

    def __init__(self, cluster, root: Path, config: Path, profile: Path) -> None:
        self.cluster, self.root, self.config, self.profile = cluster, root, config, profile
        self.out = root / "results" / yaml.safe_load(config.read_text())["name"]
        venv_bin = Path(sys.executable).parent
        # The jobs inherit this environment (sbatch --export=ALL): the venv's python first.
        self.env = {**cluster.env, "PATH": f"{venv_bin}{os.pathsep}{cluster.env['PATH']}"}

    def command(self, *extra: str) -> list[str]:
        exe = Path(sys.executable).with_name("snakemake")
        return [str(exe), "--snakefile", str(REPO / "Snakefile"), "--directory", str(self.root),
                "--configfile", str(self.config), "--profile", str(self.profile), *extra]

    def run(self, *extra: str, check: bool = True, timeout: float = 600):
        proc = subprocess.run(self.command(*extra), cwd=self.root, env=self.env, text=True,
                              capture_output=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"snakemake failed ({proc.returncode}):\n{proc.stdout}\n"
                                 f"{proc.stderr[-8000:]}\n{self.cluster.logs()}")
        return proc

    def start(self, *extra: str) -> subprocess.Popen:
        log = (self.root / "snakemake.out").open("w")
        return subprocess.Popen(self.command(*extra), cwd=self.root, env=self.env, text=True,
                                stdout=log, stderr=subprocess.STDOUT)

    def run_dir(self, run_id: str) -> Path:
        return self.out / "runs" / run_id

    def job(self, rule: str, run_id: str, states=("RUNNING",)) -> str | None:
        """The SLURM job id of `rule` for `run_id` of this sweep in one of `states` (the
        plugin puts rule and wildcards in the job comment and submits from our directory)."""
        out = self.cluster.run("squeue", "-h", "-o", "%i|%k|%T|%Z").stdout
        for line in out.splitlines():
            job, comment, state, workdir = line.split("|")
            if (comment.startswith(f"rule_{rule}_") and run_id in comment and state in states
                    and Path(workdir) == self.root):
                return job
        return None

    def slurm_logs(self, rule: str) -> str:
        """Every SLURM job log of `rule` (the plugin keeps those of failed jobs)."""
        logs = sorted((self.root / ".snakemake" / "slurm_logs" / f"rule_{rule}").rglob("*.log"))
        return "\n".join(p.read_text(errors="replace") for p in logs)


def submitted_jobs(stdout: str, rule: str) -> list[str]:
    """SLURM job ids Snakemake reported for `rule`, in order ("... submitted with SLURM jobid
    N (log: .../rule_<rule>/...)")."""
    return re.findall(rf"submitted with SLURM jobid (\d+) \(log: \S*/rule_{rule}/", stdout)


def metrics_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def wait_for(condition, what: str, timeout_s: float, proc: subprocess.Popen | None = None):
    """Poll `condition` until it returns a true value (returned); fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"snakemake exited ({proc.returncode}) before {what}")
        time.sleep(0.5)
    raise AssertionError(f"waited {timeout_s}s for {what}")
