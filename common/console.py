"""A job's printed lines reach its log as they are printed, and its exit is quick.

Under Snakemake and SLURM every job writes `> log 2>&1`, and Python buffers a stdout that is
a file in 8 KiB blocks (stderr is line-buffered since 3.9): without PYTHONUNBUFFERED a
trainer's `[trainer] resuming ... at step N` appears only when the job ends, so `tail -f`
shows nothing, and a job killed with SIGKILL (SLURM's KillWait over) loses what it printed.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys


def line_buffered_stdout() -> None:
    """Flush stdout at every newline, whatever it is connected to (a no-op on a stream that
    cannot be reconfigured, e.g. one a caller replaced)."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(line_buffering=True)


def quick_teardown() -> None:
    """Call first thing in a job's `__main__`: its exit skips the interpreter's last
    garbage collection over every object the job created, which with torch, transformers and
    MLflow loaded took 1.3-2 s of a tiny training job's ~17 (perf/main_job_profile.py, the
    2-core laptop). Registered first, the handler runs after every other atexit handler
    (MLflow's, the grader pool's, logging's), when the job's files are written and closed:
    it freezes the collector (`gc.freeze()`; objects are still freed by their reference
    counts) and sends the rest of the teardown's stderr to /dev/null, where the collector's
    absence would make triton's bindings report their objects as leaked."""
    atexit.register(_teardown_without_collection)


def _teardown_without_collection() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 2)
    os.close(quiet)
