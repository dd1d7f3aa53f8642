"""A job's printed lines reach its log as they are printed.

Under Snakemake and SLURM every job writes `> log 2>&1`, and Python buffers a stdout that is
a file in 8 KiB blocks (stderr is line-buffered since 3.9): without PYTHONUNBUFFERED a
trainer's `[trainer] resuming ... at step N` appears only when the job ends, so `tail -f`
shows nothing, and a job killed with SIGKILL (SLURM's KillWait over) loses what it printed.
"""

from __future__ import annotations

import sys


def line_buffered_stdout() -> None:
    """Flush stdout at every newline, whatever it is connected to (a no-op on a stream that
    cannot be reconfigured, e.g. one a caller replaced)."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(line_buffering=True)
