"""The fault matrix of the async and distributed path (docs/reliability.md, "Faults on the
async and distributed path"), each cell a real run of the tiny model as a user starts it:
`python -m trainer`, or `python -m trainer.launch` (torchrun, 2 gloo ranks).

Every cell asserts, from outside the job:
- the wall time from the fault to the exit (under 60 s),
- the exit code the table gives,
- the cause, in one "error: ..." line,
- no process left: every pid the job ever had (trainer, ranks, the rollout worker) is gone,
- no residue: the job's TMPDIR is empty, no /dev/shm hand-off folder of its pids is left and
  the run has no rollout-handoff/ folder,
- where the fault is resumable, that the rerun ends equal to an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from common.processes import alive, descendants, wait_gone
from trainer.handoff import SHM, SHM_PREFIX, SPILL_DIR

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

SMALL = {"n": 4, "prompts_per_step": 2, "max_new_tokens": 12, "overlong_buffer": 4,
         "dynamic_sampling": False, "staleness": 1, "mode": "async"}
EXIT_BOUND_S = 60
LAUNCH = [sys.executable, "-m", "trainer.launch", "--standalone", "--nproc-per-node", "2"]


def write_config(tmp_path: Path, name: str, model: Path, **sections) -> tuple[Path, Path]:
    cfg = {"run_id": name, "out_dir": str(tmp_path / "runs" / name), "seed": 0,
           "model": {"path": str(model), "device": "cpu"}, "rollout": dict(SMALL),
           "optim": {"steps": 3, "lr": 1e-2, "mini_batch_size": 8},
           "checkpoint": {"eval_steps": [3]},
           "tracking": {"mlflow_uri": None, "progress": False}}
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, Path(cfg["out_dir"])


def environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, PermissionError):
        return {}
    return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)


class Job:
    """A trainer job started as a user does, in a session of its own, its every pid recorded
    while it runs (so none can hide after the exit), with its own TMPDIR."""

    def __init__(self, cmd: list[str], tmp: Path, env: dict | None = None, prefix=()) -> None:
        self.tmpdir = tmp / f"tmp-{time.monotonic_ns()}"
        self.tmpdir.mkdir()
        self.out, self.err = tmp / f"{self.tmpdir.name}.out", tmp / f"{self.tmpdir.name}.err"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
                    "TMPDIR": str(self.tmpdir), **(env or {})}
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen([*prefix, *cmd], env=full_env, stdout=out,
                                         stderr=err, start_new_session=True)
        self.pids = {self.proc.pid}
        self._watching = True
        self._watch = threading.Thread(target=self._record, daemon=True)
        self._watch.start()

    def _record(self) -> None:
        while self._watching and self.proc.poll() is None:
            self.pids |= descendants(self.proc.pid)
            time.sleep(0.05)

    def stdout(self) -> str:
        return self.out.read_text()

    def stderr(self) -> str:
        return self.err.read_text()

    def wait_for(self, pattern: str, timeout: float = 180) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern, self.stdout())
            if found:
                return found
            assert self.proc.poll() is None, f"exited {self.proc.returncode} before " \
                f"{pattern!r}:\n{self.stderr()[-3000:]}"
            assert time.monotonic() < deadline, f"no {pattern!r} in {timeout} s"
            time.sleep(0.05)

    def wait_for_file(self, path: Path, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            assert self.proc.poll() is None, self.stderr()[-3000:]
            assert time.monotonic() < deadline, f"no {path} in {timeout} s"
            time.sleep(0.05)

    def worker_pid(self) -> int:
        return int(self.wait_for(r"rollout worker pid (\d+)").group(1))

    def rank_pid(self, rank: int) -> int:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for pid in descendants(self.proc.pid):
                env = environ(pid)
                if env.get("RANK") == str(rank) and "TORCHELASTIC_RUN_ID" in env:
                    return pid
            time.sleep(0.1)
        raise AssertionError(f"no rank {rank} found")

    def finish(self, timeout: float = EXIT_BOUND_S) -> tuple[int, float]:
        """The exit code and the seconds it took from now."""
        start = time.monotonic()
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise AssertionError(f"no exit within {timeout} s:\n{self.stderr()[-3000:]}") from None
        finally:
            self._watching = False
        return code, time.monotonic() - start

    def assert_clean(self, run: Path) -> None:
        """No process of the job alive (children are given 5 s to be reaped), nothing in its
        TMPDIR, no /dev/shm hand-off of its pids, no hand-off folder in the run."""
        left = wait_gone(self.pids, timeout=5)
        assert not left, f"processes left: {sorted(left)}"
        assert not any(self.tmpdir.iterdir()), sorted(self.tmpdir.iterdir())
        assert not [p for p in self.pids if (SHM / f"{SHM_PREFIX}{p}").exists()]
        assert not (run / SPILL_DIR).exists()


def cause(job: Job) -> str:
    """The job's "error: ..." line (the last one), which must be one line naming the cause."""
    lines = [line for line in job.stderr().splitlines() if line.startswith("error: ")]
    assert lines, job.stderr()[-3000:]
    return lines[-1]


def untimed(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time_") and k != "tokens_per_sec"}
            for r in rows]


def trainer(config: Path) -> list[str]:
    return [sys.executable, "-m", "trainer", "--config", str(config)]


@pytest.fixture(scope="module")
def reference(tiny_model, tmp_path_factory):
    """An uninterrupted run (one process) to compare resumed runs with, once per worker."""
    tmp_path = tmp_path_factory.mktemp("reference")
    config, run = write_config(tmp_path, "whole", tiny_model)
    job = Job(trainer(config), tmp_path)
    assert job.finish(timeout=300)[0] == 0, job.stderr()[-3000:]
    return untimed(run)


# ------------------------------------------------------------------ set-up


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("point", ["tracker", "config"])
def test_setup_failing_after_the_worker_started_ends_everything(tiny_model, tmp_path, point,
                                                                world):
    config, run = write_config(tmp_path, f"setup-{point}", tiny_model,
                               debug={"fail_in_setup": point})
    cmd = [*LAUNCH, "-m", "trainer", "--config", str(config)] if world == 2 else trainer(config)
    job = Job(cmd, tmp_path)
    job.worker_pid()
    code, seconds = job.finish()
    assert code == 1 and seconds < EXIT_BOUND_S
    assert re.search(rf"error: OSError: debug.fail_in_setup: the {point}", job.stderr())
    job.assert_clean(run)


@pytest.mark.parametrize(("sig", "code", "said"), [
    (signal.SIGINT, 130, r"error: interrupted \(SIGINT\)"),
    (signal.SIGTERM, 75, r"error: SIGTERM received outside a training step"),
    (signal.SIGHUP, 129, r"error: SIGHUP received outside a training step"),
])
def test_a_signal_during_setup_ends_everything(tiny_model, tmp_path, sig, code, said):
    config, run = write_config(tmp_path, "setup-signal", tiny_model,
                               debug={"sleep_in_setup_s": 60})
    job = Job(trainer(config), tmp_path)
    job.worker_pid()
    os.kill(job.proc.pid, sig)
    got, seconds = job.finish()
    assert got == code and seconds < EXIT_BOUND_S, job.stderr()[-3000:]
    assert re.match(said, cause(job))
    job.assert_clean(run)


def test_a_rerun_after_sigterm_in_setup_equals_the_uninterrupted_run(tiny_model, tmp_path,
                                                                    reference):
    config, run = write_config(tmp_path, "setup-term", tiny_model,
                               debug={"sleep_in_setup_s": 60})
    job = Job(trainer(config), tmp_path)
    job.worker_pid()
    os.kill(job.proc.pid, signal.SIGTERM)
    assert job.finish()[0] == 75
    job.assert_clean(run)
    config, run = write_config(tmp_path, "setup-term", tiny_model)
    again = Job(trainer(config), tmp_path)
    assert again.finish(timeout=300)[0] == 0, again.stderr()[-3000:]
    assert untimed(run) == reference


# ------------------------------------------------------------------ the rollout worker


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("when", ["idle", "generating"])
def test_a_killed_worker_ends_the_job(tiny_model, tmp_path, when, world):
    """Idle: between steps (the step's sampling-ahead long done); generating: inside a
    30 s generate that the ranks wait for."""
    debug = ({"sleep_per_step_s": 5} if when == "idle" else {"rollout_delay_s": 30})
    config, run = write_config(tmp_path, f"kill-{when}", tiny_model,
                               optim={"steps": 20}, debug=debug)
    cmd = [*LAUNCH, "-m", "trainer", "--config", str(config)] if world == 2 else trainer(config)
    job = Job(cmd, tmp_path)
    worker = job.worker_pid()
    if when == "idle":
        job.wait_for_file(run / "metrics.jsonl")
        time.sleep(2)  # inside the 5 s sleep after step 1
    else:
        time.sleep(3)
    os.kill(worker, signal.SIGKILL)
    code, seconds = job.finish()
    assert code == 1 and seconds < EXIT_BOUND_S, job.stderr()[-3000:]
    assert re.search(rf"error: WorkerFailed: rollout worker \(pid {worker}\) died \(signal 9\)",
                     job.stderr())
    job.assert_clean(run)


def test_a_worker_dying_while_loading_weights_ends_the_job_and_leaves_no_file(tiny_model,
                                                                              tmp_path):
    """The worker exits with the pushed file read and not yet loaded: the trainer removes
    what the hand-off left."""
    config, run = write_config(tmp_path, "kill-loading", tiny_model,
                               debug={"rollout_worker_fault": [1, "exit_loading"]})
    job = Job(trainer(config), tmp_path)
    job.worker_pid()
    code, seconds = job.finish(timeout=120)
    assert code == 1, job.stderr()[-3000:]
    assert re.search(r"error: WorkerFailed: rollout worker \(pid \d+\) died \(exit code 17\)",
                     job.stderr())
    job.assert_clean(run)


def test_wrong_weights_under_the_right_label_stop_the_run(tiny_model, tmp_path):
    """The worker skips loading step 1's weights and samples with step 0's under step 1's
    label: the fingerprint it returns is not step 1's, and the run stops before it trains
    on that rollout."""
    config, run = write_config(tmp_path, "wrong", tiny_model,
                               debug={"rollout_wrong_weights": 1})
    job = Job(trainer(config), tmp_path)
    code, _ = job.finish(timeout=180)
    assert code == 1, job.stderr()[-3000:]
    assert re.search(r"error: WrongWeights: the rollout worker \(pid \d+\) sampled request \d+ "
                     r"under the label of step 1, but the weights it holds have fingerprint",
                     job.stderr())
    assert [r["step"] for r in untimed(run)] == [1, 2]  # step 3 was sampled by theta_1
    job.assert_clean(run)


# ------------------------------------------------------------------ ranks


def test_a_killed_rank_ends_the_job(tiny_model, tmp_path):
    config, run = write_config(tmp_path, "kill-rank", tiny_model, optim={"steps": 20},
                               debug={"sleep_per_step_s": 2})
    job = Job([*LAUNCH, "-m", "trainer", "--config", str(config)], tmp_path)
    job.worker_pid()
    rank1 = job.rank_pid(1)
    job.wait_for_file(run / "metrics.jsonl")
    os.kill(rank1, signal.SIGKILL)
    code, seconds = job.finish()
    assert code != 0 and seconds < EXIT_BOUND_S
    job.assert_clean(run)


def test_a_hung_rank_is_named_within_the_collective_timeout(tiny_model, tmp_path):
    """A rank that stops (SIGSTOP: alive, silent) while rank 0 waits in `align`: rank 0
    names it once the timeout passes without a heartbeat, and the job ends."""
    config, run = write_config(tmp_path, "hung-rank", tiny_model, optim={"steps": 20},
                               debug={"sleep_per_step_s": 4})
    job = Job([*LAUNCH, "-m", "trainer", "--config", str(config)], tmp_path,
              env={"RPG_COLLECTIVE_TIMEOUT_S": "5"})
    job.worker_pid()
    rank1 = job.rank_pid(1)
    job.wait_for_file(run / "metrics.jsonl")
    time.sleep(2)  # both ranks inside step 2's 4 s sleep: rank 0 then waits in `align`
    os.kill(rank1, signal.SIGSTOP)
    try:
        code, seconds = job.finish()
    finally:
        if alive(rank1):
            os.kill(rank1, signal.SIGCONT)
    assert code != 0 and seconds < EXIT_BOUND_S
    assert re.search(r"PeerLost: rank 0 waited for every rank at .*: rank 1 has shown no sign "
                     r"of life", job.stderr()), job.stderr()[-3000:]
    job.assert_clean(run)


# ------------------------------------------------------------------ preemption


@pytest.mark.parametrize("when", ["rollout", "update", "checkpoint"])
def test_sigterm_inside_a_step_saves_exits_75_and_resumes_the_same(tiny_model, tmp_path,
                                                                   reference, when):
    """Rollout: the signal lands while the worker samples (a 4 s generate); update: as the
    update starts (debug.signal_in_update); checkpoint: inside the HF checkpoint write
    (debug.signal_in_checkpoint). Each time the step ends, the state is saved, the job exits
    75 and the rerun equals the uninterrupted run."""
    debug = {"rollout": {"rollout_delay_s": 4}, "update": {"signal_in_update": 2},
             "checkpoint": {"signal_in_checkpoint": 1}}[when]
    checkpoint = {"eval_steps": [1, 3]} if when == "checkpoint" else {}
    config, run = write_config(tmp_path, f"term-{when}", tiny_model, debug=debug,
                               checkpoint=checkpoint)
    job = Job(trainer(config), tmp_path)
    job.worker_pid()
    if when == "rollout":
        time.sleep(2)
        os.kill(job.proc.pid, signal.SIGTERM)
    code, seconds = job.finish()
    assert code == 75 and seconds < EXIT_BOUND_S, job.stderr()[-3000:]
    assert (run / "state").is_dir()
    job.assert_clean(run)
    config, run = write_config(tmp_path, f"term-{when}", tiny_model, checkpoint=checkpoint)
    again = Job(trainer(config), tmp_path)
    assert again.finish(timeout=300)[0] == 0, again.stderr()[-3000:]
    assert untimed(run) == reference


# ------------------------------------------------------------------ the hand-off


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs in a private namespace (root)")
def test_a_small_dev_shm_and_few_descriptors_fall_back_to_the_run_folder(tiny_model, tmp_path,
                                                                        reference):
    """A 64 MB /dev/shm with all but 4 KB taken (smaller than one push of the tiny model)
    and `ulimit -n 256`: the run completes through the run folder, says so in one warning,
    and writes the uninterrupted run's metrics."""
    config, run = write_config(tmp_path, "small-shm", tiny_model)
    setup = ("mount -t tmpfs -o size=64m tmpfs /dev/shm && "
             "fallocate -l $((64 * 1024 * 1024 - 4 * 1024)) /dev/shm/ballast && "
             "ulimit -n 256 && exec \"$@\"")
    job = Job(trainer(config), tmp_path, prefix=["unshare", "-m", "sh", "-c", setup, "sh"])
    assert job.finish(timeout=300)[0] == 0, job.stderr()[-3000:]
    warnings = [line for line in job.stdout().splitlines()
                if "weights go to the rollout worker through" in line]
    assert len(warnings) == 1 and f"{run / SPILL_DIR}" in warnings[0], job.stdout()[-2000:]
    assert untimed(run) == reference
    job.assert_clean(run)
