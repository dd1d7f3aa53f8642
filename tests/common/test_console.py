"""common.console: a job's exit skips the last garbage collection, after every other exit
handler has run and with their output intact."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_the_teardown_handler_runs_after_the_others_and_freezes_the_collector(tmp_path):
    """Handlers registered after quick_teardown (MLflow's, the grader pool's) run before it,
    with the collector working and stderr open, and what they write is whole; after it the
    collector is frozen and stderr goes nowhere (what follows is the interpreter's teardown:
    a handler registered before it stands in for that here)."""
    out = tmp_path / "written.txt"
    script = textwrap.dedent(f"""
        import atexit, gc, sys
        def teardown_stand_in():
            print("frozen in the teardown:", gc.get_freeze_count() > 0, flush=True)
            print("teardown noise", file=sys.stderr, flush=True)
        atexit.register(teardown_stand_in)
        from common.console import quick_teardown
        quick_teardown()
        def late_handler():
            print("frozen in a late handler:", gc.get_freeze_count() > 0, file=sys.stderr)
            with open({str(out)!r}, "w") as f:
                f.write("x" * 100000)
        atexit.register(late_handler)
        sys.exit(3)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 3
    assert "frozen in a late handler: False" in done.stderr
    assert len(out.read_text()) == 100000
    assert "frozen in the teardown: True" in done.stdout
    assert "teardown noise" not in done.stderr
