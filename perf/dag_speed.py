"""`snakemake -n` (building the DAG) at two checkouts, interleaved: wall seconds and the ratio.

    git worktree add /tmp/old bb6f6d8
    python perf/dag_speed.py --old /tmp/old [--new .] [--repeats 5] [--configfile ...]

Every snakemake invocation pays this: a dry run, a rerun, and each SLURM job step (the
executor plugin starts Snakemake again inside the job). Each repeat runs both checkouts
back to back, alternating which goes first, so both see the same machine load; Snakemake
runs in the checkout with `PYTHONPATH` = the checkout and results in a scratch folder.
Prints each run, the medians, the ratio new / old, and whether both printed the same job
counts.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def dry_run(code: Path, configfiles: list[str], results: Path) -> tuple[float, str]:
    """(wall seconds, the 'Job stats' table) of one `snakemake -n` in checkout `code`."""
    exe = Path(sys.executable).with_name("snakemake")
    env = {**os.environ, "PYTHONPATH": str(code)}
    start = time.perf_counter()
    proc = subprocess.run([str(exe), "-n", "--configfile", *configfiles, "--config",
                           f"results_dir={results}"], cwd=code, env=env, text=True,
                          capture_output=True, check=True)
    seconds = time.perf_counter() - start
    stats = re.search(r"Job stats:.*?\ntotal\s+\d+", proc.stdout, re.S)
    return seconds, stats.group(0) if stats else proc.stdout[-500:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", type=Path, required=True, help="the baseline checkout")
    ap.add_argument("--new", type=Path, default=REPO)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--configfile", nargs="+", default=["config/default.yaml"])
    args = ap.parse_args()
    times: dict[str, list[float]] = {"old": [], "new": []}
    stats: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for r in range(args.repeats):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            for name in order:
                code = (args.old if name == "old" else args.new).resolve()
                seconds, stats[name] = dry_run(code, args.configfile, Path(scratch) / name)
                times[name].append(seconds)
                print(f"repeat {r}  {name}  {seconds:6.2f} s", flush=True)
    old, new = (statistics.median(times[k]) for k in ("old", "new"))
    print(f"median  old {old:.2f} s  new {new:.2f} s  ratio new/old {new / old:.2f}")
    print("same job counts:", stats["old"] == stats["new"])


if __name__ == "__main__":
    main()
