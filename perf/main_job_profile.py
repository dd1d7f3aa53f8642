"""Where the main job's time goes: each rule's wall time, then inside the train jobs their
start-up, steps (rollout, log-probs, update), the rest of training and the evaluations.

    snakemake -c 2 && python perf/main_job_profile.py results/default
    python perf/main_job_profile.py results/default --run     # runs `snakemake -c 2` first

From one sweep's files: the rules from Snakemake's `benchmark:` files (perf/rule_times.py);
the phases from each run's `job_times.json` (written by `python -m sweep.job`: the
process's start-up, the trainer's call, the evaluation) and metrics.jsonl's `time_*` keys.
Shares are of the train jobs' summed wall seconds; what no phase covers (the interpreter's
exit, a `--runs` job's log switching) is "the rest of the job".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common.layout import RunDir, SweepDir  # noqa: E402
from perf.rule_times import read_jobs, render, span_s, summarize  # noqa: E402

STEP_PARTS = {"rollout": "time_rollout", "log-probs": "time_logprob", "update": "time_update"}


def run_phases(run: RunDir) -> dict[str, float]:
    """One run's seconds by phase (job_times.json and metrics.jsonl)."""
    times = json.loads(run.job_times.read_text())
    rows = [json.loads(line) for line in run.metrics.read_text().splitlines() if line.strip()]
    steps = {part: sum(r.get(key) or 0.0 for r in rows) for part, key in STEP_PARTS.items()}
    step_total = sum(r.get("time_step") or 0.0 for r in rows)
    return {"start-up (interpreter, imports)": times["start_up_s"],
            **{f"steps: {part}": s for part, s in steps.items()},
            "steps: other (metrics, reference)": step_total - sum(steps.values()),
            "set-up, checkpoints, MLflow": times["train_s"] - step_total,
            "evaluation": times["eval_s"]}


def phase_table(sweep_dir: Path, train_wall_s: float) -> tuple[pd.DataFrame, int]:
    """(seconds and share of every phase, summed over the sweep's runs; how many runs)."""
    found = [run for run in SweepDir(sweep_dir).run_dirs() if run.job_times.is_file()]
    if not found:
        raise SystemExit(f"{sweep_dir}: no runs/*/job_times.json; run the sweep with this "
                         "checkout (python -m sweep.job writes them)")
    total = pd.DataFrame([run_phases(run) for run in found]).sum()
    total["the rest of the job (exit, logs)"] = train_wall_s - total.sum()
    return pd.DataFrame({"seconds": total, "share": total / train_wall_s}), len(found)


def render_phases(table: pd.DataFrame, runs: int) -> str:
    lines = [f"train jobs' phases, summed over {runs} runs:",
             f"{'phase':36s} {'seconds':>9s} {'share':>7s}"]
    for phase, row in table.iterrows():
        lines.append(f"{phase:36s} {row.seconds:9.1f} {row.share:7.1%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python perf/main_job_profile.py",
                                description=__doc__.split("\n")[0])
    p.add_argument("sweep_dir", type=Path, help="results/<sweep>")
    p.add_argument("--run", action="store_true", help="run `snakemake -c 2` here first")
    a = p.parse_args(argv)
    if a.run:
        subprocess.run(["snakemake", "-c", "2", "--forceall"], check=True, cwd=REPO)
    jobs = read_jobs(a.sweep_dir)
    print(render(summarize(jobs), span_s(jobs)))
    print()
    train_wall = float(jobs.loc[jobs["rule"] == "train", "s"].sum())
    table, runs = phase_table(a.sweep_dir, train_wall)
    print(render_phases(table, runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
