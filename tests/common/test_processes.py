"""common.processes: a process tree found through /proc and ended as one, children in
sessions of their own and ones that ignore SIGTERM included."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from common.processes import descendants, kill_tree, run_tree, wait_gone

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# parent -> child (a session of its own, ignores TERM) -> grandchild
TREE = """
import subprocess, sys, time
code = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        "time.sleep(600)")
subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
print("up", flush=True)
time.sleep(600)
"""


def test_kill_tree_ends_every_descendant():
    proc = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        deadline = time.monotonic() + 30
        while len(descendants(proc.pid)) < 2:
            assert time.monotonic() < deadline, descendants(proc.pid)
            time.sleep(0.05)
        tree = descendants(proc.pid) | {proc.pid}
        assert kill_tree(proc.pid) >= tree
        proc.wait(timeout=10)
        assert not wait_gone(tree)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_run_tree_kills_the_tree_at_its_timeout():
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        run_tree([sys.executable, "-c", TREE], timeout=3)
    assert time.monotonic() - start < 15
    assert "up" in caught.value.stdout
    done = run_tree([sys.executable, "-c", "print('ok')"], timeout=30)
    assert (done.returncode, done.stdout.strip()) == (0, "ok")


def test_seconds_since_start_reads_the_kernels_clock():
    """A child started now is younger than this process, and about as old as the time
    since it was started (the kernel counts in 10 ms ticks)."""
    import subprocess
    import time

    from common.processes import seconds_since_start

    start = time.monotonic()
    child = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.3)
        age = seconds_since_start(child.pid)
        waited = time.monotonic() - start
        assert 0.2 <= age <= waited + 0.05
        assert seconds_since_start() > age
    finally:
        child.kill()
        child.wait()
