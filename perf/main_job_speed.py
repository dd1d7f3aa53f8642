"""The main job (`snakemake -c 2`, config/default.yaml) at two checkouts, one after the
other in one invocation: wall time and span ratio new / old, and whether every number is
the same.

    git worktree add /tmp/old <commit before the change>
    python perf/main_job_speed.py --old /tmp/old [--new .] [--repeats 1]

Each checkout runs the README's command with `results_dir` = `--work`/results (fresh each
time; the same path for both, since evaluation records and runs.csv name it), then the
folder is moved to `--work`/<old or new>; which checkout goes first alternates from one
repeat to the next so both see the same machine. Prints per run the wall seconds of the whole command and the span
from the first job's start to the last job's end (perf/rule_times.py), their medians and
ratios, then the comparison of the last repeat's outputs: every metrics.jsonl and
evaluation file (perf/same_numbers.py, timing keys dropped) and every table CSV the report
writes, whole, except train_metrics.csv's timing columns.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from perf.default_speed import interleaved, two_checkouts  # noqa: E402
from perf.rule_times import read_jobs, span_s  # noqa: E402
from perf.same_numbers import differing, is_timing  # noqa: E402


def run_main_job(code: Path, results: Path, keep: Path) -> dict[str, float]:
    """`snakemake -c 2` in checkout `code`, writing under `results`, then moved to `keep`;
    wall and span seconds."""
    shutil.rmtree(results, ignore_errors=True)
    shutil.rmtree(keep, ignore_errors=True)
    start = time.perf_counter()
    done = subprocess.run(["snakemake", "-c", "2", "--config", f"results_dir={results}"],
                          cwd=code, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{code}: snakemake failed:\n{done.stderr[-3000:]}")
    span = span_s(read_jobs(results / "default", code / "workflow/rules"))
    shutil.move(results, keep)
    return {"wall": wall, "span": span}


def same_tables(old: Path, new: Path) -> list[str]:
    """The report's table CSVs that differ (timing columns of train_metrics.csv aside)."""
    differ = []
    for path in sorted((old / "tables").glob("*.csv")):
        a, b = pd.read_csv(path), pd.read_csv(new / "tables" / path.name)
        keep = [c for c in a.columns if not is_timing(c)]
        if list(a.columns) != list(b.columns) or not a[keep].equals(b[keep]):
            differ.append(path.name)
    return differ


def same_numbers(old: Path, new: Path) -> str:
    files, differ = differing(old, new)
    tables = same_tables(old, new)
    if not differ and not tables:
        return f"ALL IDENTICAL ({len(files)} run files, every table)"
    return f"DIFFER: {len(differ)} of {len(files)} run files {differ[:4]}, tables {tables}"


def main() -> None:
    a = two_checkouts(__doc__, "/tmp/main_job_speed", repeats=1)
    interleaved(a, lambda code, label: run_main_job(code, a.work / "results", a.work / label),
                ("wall", "span"))
    print("same numbers (last repeat):",
          same_numbers(a.work / "old/default", a.work / "new/default"))


if __name__ == "__main__":
    main()
