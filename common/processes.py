"""A process and everything it started, found and ended as one (Linux's /proc).

    run_tree(argv, timeout=60, env=...)   # subprocess.run that kills the whole tree at timeout
    descendants(pid); kill_tree(pid)

Why: killing a launcher is not killing its job. torchrun starts each rank in a session of
its own, so neither `subprocess.run`'s kill at its timeout nor a signal to the launcher's
process group reaches the ranks, which then keep their GPUs. The tree is read from the
kernel's list of each task's children, so a child in another session or one that ignores
SIGTERM is still found and killed (SIGKILL). Elsewhere than Linux only the process group
is reached.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def descendants(pid: int) -> set[int]:
    """Every process below `pid` now (children, theirs, ...): /proc/<pid>/task/*/children."""
    out: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = list(Path(f"/proc/{parent}/task").iterdir())
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            continue
        for task in tasks:
            try:
                kids = {int(c) for c in (task / "children").read_text().split()}
            except (FileNotFoundError, ProcessLookupError):
                continue
            todo += sorted(kids - out)
            out |= kids
    return out


def kill_tree(pid: int) -> set[int]:
    """SIGKILL `pid` and every descendant (stopped first, so none starts another while the
    tree is read); returns the pids killed."""
    tree = {pid}
    for _ in range(3):  # a child may have been started while the tree was read
        new = descendants(pid) | {d for p in tree for d in descendants(p)}
        if new <= tree:
            break
        tree |= new
    for p in tree:
        try:
            os.kill(p, signal.SIGSTOP)
        except (ProcessLookupError, PermissionError):
            pass
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(pid, signal.SIGKILL)  # its own group (started in a session of its own)
    except (ProcessLookupError, PermissionError):
        pass
    return tree


def run_tree(argv: list[str], *, timeout: float | None, **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run(argv, capture_output=True, text=True, **kwargs)` in a session of its
    own; at `timeout` the whole tree is killed (kill_tree) and TimeoutExpired raised with
    the output so far."""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, **kwargs) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(argv, timeout, out, err) from None
        except BaseException:  # an interrupt of the caller: the job goes with it
            kill_tree(proc.pid)
            raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def wait_gone(pids: set[int], timeout: float = 5.0) -> set[int]:
    """The pids still alive (not zombies) after up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = {p for p in pids if alive(p)}
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def pid_alive(pid: int) -> bool:
    """A process with this pid exists (zombies included; another user's counts): kill(0)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def alive(pid: int) -> bool:
    """`pid` runs (a zombie, ended and not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def seconds_since_start(pid: int | None = None) -> float | None:
    """How long ago process `pid` (this one by default) started, from the kernel's clock
    (/proc/<pid>/stat's start time against /proc/uptime): includes the interpreter's own
    start-up and imports, which no timer inside the program sees. None off Linux."""
    try:
        stat = Path(f"/proc/{pid or os.getpid()}/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (FileNotFoundError, ProcessLookupError):
        return None
    ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, after the command's ")"
    return uptime - ticks / os.sysconf("SC_CLK_TCK")
