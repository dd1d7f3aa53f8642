"""The job's end time, so the trainer saves and exits before a step it cannot finish.

A scheduler kills a job at its time limit; its warning signal (SLURM `--signal`) arrives
at a fixed lead and is checked only between steps, which may last longer than the lead.
So the trainer also knows the end time itself: `--deadline` (epoch seconds or ISO 8601),
else SLURM's `SLURM_JOB_END_TIME`. Before each step it compares the time left with the
longest step seen so far plus the time the last state save took (and a safety margin);
if the step would not fit, it saves the resume state and exits 75 ("rerun to resume").
"""

from __future__ import annotations

import datetime
import os


def parse_deadline(value: str | None) -> float | None:
    """Epoch seconds from '1733000000' or an ISO 8601 time ('2026-12-01T02:00:00+00:00');
    a time without a zone is local time. None/empty: no deadline."""
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return datetime.datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise ValueError(f"deadline {value!r}: give epoch seconds or an ISO 8601 time, "
                         "e.g. 2026-12-01T02:00:00+00:00") from None


def job_deadline(cli_value: str | None = None) -> float | None:
    """--deadline if given, else SLURM_JOB_END_TIME (set inside SLURM jobs), else None."""
    return parse_deadline(cli_value) or parse_deadline(os.environ.get("SLURM_JOB_END_TIME"))


class Deadline:
    """Decides, before each step, whether one more step and a save still fit."""

    def __init__(self, end: float | None, margin_s: float = 60.0) -> None:
        self.end, self.margin_s = end, margin_s
        self.longest_step_s = 0.0
        self.save_s = 0.0

    def record_step(self, seconds: float) -> None:
        self.longest_step_s = max(self.longest_step_s, seconds)

    def record_save(self, seconds: float) -> None:
        self.save_s = max(self.save_s, seconds)

    def must_stop(self, now: float) -> bool:
        """True when the next step (as long as the longest so far) plus a state save plus
        the margin would end past the deadline."""
        if self.end is None:
            return False
        return now + self.longest_step_s + self.save_s + self.margin_s > self.end
