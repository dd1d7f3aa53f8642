"""The helpers of perf/real_step_profile.py and perf/main_job_speed.py that decide what is
reported: a wrapped call's seconds land in its part, medians skip the first step, and two
tables differ only where a number or a column does (timing columns aside)."""

from __future__ import annotations

import pandas as pd

from perf.main_job_speed import same_tables
from perf.real_step_profile import PARTS, medians, timed


def test_a_timed_call_adds_its_seconds_to_its_part_and_returns_its_result():
    class Engine:
        def generate(self, x, *, n):
            return x * n

    engine, bucket = Engine(), dict.fromkeys(PARTS, 0.0)
    timed(engine, "generate", bucket, "generation")
    assert engine.generate(3, n=2) == 6
    assert bucket["generation"] > 0 and bucket["update"] == 0


def test_medians_leave_the_first_step_out():
    steps = [dict.fromkeys((*PARTS, "step"), v) for v in (100.0, 1.0, 2.0, 3.0)]
    assert medians(steps)["step"] == 2.0
    assert medians(steps[:1])["step"] == 100.0  # one step: that one


def _tables(root, **rows):
    (root / "tables").mkdir(parents=True)
    for name, frame in rows.items():
        pd.DataFrame(frame).to_csv(root / "tables" / f"{name}.csv", index=False)


def test_tables_differ_by_numbers_or_columns_not_by_timings(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    _tables(old, a={"x": [1.0, 2.0], "time_step": [1, 2]}, b={"y": [1]})
    _tables(new, a={"x": [1.0, 2.0], "time_step": [5, 6]}, b={"y": [1], "z": [0]})
    assert same_tables(old, new) == ["b.csv"]
    (new / "tables" / "a.csv").write_text("x,time_step\n1.0,1\n2.5,2\n")
    assert same_tables(old, new) == ["a.csv", "b.csv"]
