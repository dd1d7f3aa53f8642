"""Overlapped rollouts (`rollout.mode: async`, trainer.async_rollout): the engine samples in a
process of its own, one step ahead, and the run is the simulated `rollout.staleness: k` run
exactly (metrics bit for bit, timings aside; final weights equal). A rollout scored by other
weights than those that sampled it stops the run; a dead worker ends it with its error; a
killed trainer leaves no worker; a preempted run resumes to the uninterrupted one."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from test_staleness import SMALL, final_weights, logprobs_with, record_updates, untimed

from common.generation.hf import HFEngine
from trainer import async_rollout, handoff
from trainer.async_rollout import WorkerFailed, check_scored_by_sampler
from trainer.config import parse_run_config
from trainer.loop import Trainer, train
from trainer.staleness import cpu_snapshot

pytestmark = pytest.mark.slow


def assert_same_run(a: Path, b: Path, steps: int) -> None:
    assert untimed(a) == untimed(b)
    for name, tensor in final_weights(a, steps).items():
        assert torch.equal(final_weights(b, steps)[name], tensor), name


@pytest.mark.parametrize("k", [1, 2])
def test_async_equals_the_simulated_staleness(make_cfg, k):
    """Same seeds: the async run writes the simulated run's metrics.jsonl and ends on its
    weights; each step logs the weights that sampled it, theta_{max(t-1-k, 0)}."""
    steps = k + 3
    common = {"optim": {"steps": steps, "lr": 1e-2, "mini_batch_size": 8}}
    simulated = train(make_cfg(f"sim{k}", rollout={**SMALL, "staleness": k}, **common))
    overlapped = train(make_cfg(f"async{k}", rollout={**SMALL, "staleness": k,
                                                      "mode": "async"}, **common))
    assert_same_run(simulated, overlapped, steps)
    rows = untimed(overlapped)
    assert [r["rollout_weights_step"] for r in rows] == [max(t - 1 - k, 0)
                                                         for t in range(1, steps + 1)]
    assert [r["rollout_staleness"] for r in rows] == [min(t - 1, k) for t in range(1, steps + 1)]
    assert all(r["grad_norm"] > 0 for r in rows)  # the weights moved: a lag mattered


def test_a_lora_run_hands_the_base_over_once_and_equals_the_simulated_run(make_cfg,
                                                                        monkeypatch):
    """Under LoRA only the adapters train: the first push carries the whole state, every
    later one the adapters only (trainer.handoff), and the run is the simulated one."""
    sent = []
    write = handoff.HandOff.write

    def recording(self, state, step):
        sent.append(sorted(state))
        return write(self, state, step)

    monkeypatch.setattr(handoff.HandOff, "write", recording)
    common = {"model": {"lora": {"rank": 2}}, "optim": {"steps": 4, "lr": 1e-2}}
    simulated = train(make_cfg("sim-lora", rollout={**SMALL, "staleness": 1}, **common))
    overlapped = train(make_cfg("async-lora", rollout={**SMALL, "staleness": 1, "mode": "async"},
                                **common))
    assert_same_run(simulated, overlapped, 4)
    first, *later = sent
    assert any("lora_" not in name for name in first) and len(later) >= 2
    assert all(names and all("lora_" in name for name in names) for names in later), later


def test_each_rollout_is_scored_by_the_weights_that_sampled_it(make_cfg):
    """Checked from outside the worker: each step's tokens are what the weights step t-k
    started from sample with the step's prompts and seed (regenerated here, in process),
    and its pi_old is those weights' log-probs, not the newer weights' being trained."""
    k, steps = 2, 4
    trainer = Trainer(make_cfg("outside", rollout={**SMALL, "staleness": k, "mode": "async"},
                               optim={"steps": steps, "lr": 1e-2}))
    trainer.setup(track=False)
    seen = record_updates(trainer)
    asked = []  # per step: the first round's prompts and seed
    started_from = []
    try:
        for t in range(1, steps + 1):
            asked.append(trainer.collector.first_round(t))
            started_from.append(cpu_snapshot(trainer.model))
            trainer.step()
    finally:
        trainer.engine.engine.close()
    r = trainer.cfg.rollout
    for t in range(1, steps + 1):
        batch, old_logp = seen[t - 1]
        weights = started_from[max(t - 1 - k, 0)]
        assert torch.equal(logprobs_with(trainer, weights, batch), old_logp), t
        if t > 1:
            assert not torch.allclose(logprobs_with(trainer, started_from[t - 1], batch),
                                      old_logp), t
        model = copy.deepcopy(trainer.model)
        model.load_state_dict(weights)
        again = HFEngine(model, trainer.tokenizer, batch_size=r.gen_batch_size)
        [(prompts, seed)] = asked[t - 1]  # one process: one share
        samples = again.generate(prompts, n=r.n, temperature=r.temperature, top_p=r.top_p,
                                 max_new_tokens=r.max_new_tokens, seed=seed)
        tokens = [s.token_ids for group in samples for s in group]
        sampled = [row[m].tolist() for row, m in zip(batch.response_ids, batch.response_mask.bool())]
        assert [list(x) for x in tokens] == sampled, t


def test_a_rollout_sampled_ahead_with_the_wrong_weights_is_not_used(make_cfg, monkeypatch):
    """A step sampled ahead with the weights being trained (newer than the lag's) is
    thrown away and sampled again with the lag's: the run is still the simulated one. The
    guard behind it: a rollout whose weights' step differs from the scoring one stops the
    run (check_scored_by_sampler)."""

    def ahead_with_newest(self, step):
        worker = self.overlapped
        worker.ensure(self.global_step, lambda: cpu_snapshot(self.model))
        r = self.cfg.rollout
        worker.submit(self.collector.first_round(step), n=r.n, temperature=r.temperature,
                      top_p=r.top_p, max_new_tokens=r.max_new_tokens)

    common = {"rollout": {**SMALL, "staleness": 1}, "optim": {"steps": 3, "lr": 1e-2}}
    simulated = train(make_cfg("sim", **common))
    monkeypatch.setattr(Trainer, "sample_ahead", ahead_with_newest)
    wrong = train(make_cfg("wrong", **{**common, "rollout": {**common["rollout"],
                                                              "mode": "async"}}))
    assert_same_run(simulated, wrong, 3)
    with pytest.raises(RuntimeError, match=r"step 5: the rollout was sampled by the weights "
                                           r"of step\(s\) \[3\] but would be scored by "
                                           r"those of step 2"):
        check_scored_by_sampler([2, 3], 2, step=5)
    check_scored_by_sampler([2, 2], 2, step=5)


def test_async_without_staleness_is_refused_before_anything_runs(make_cfg):
    with pytest.raises(ValueError, match=r"rollout.mode=async .* set rollout.staleness >= 1"):
        make_cfg("bad", rollout={"mode": "async"})


@pytest.mark.parametrize(("how", "said"), [
    ("raise", r"(?s)failed:\n.*debug.rollout_worker_fault: the worker fails"),
    ("exit", r"died \(exit code 17\) without reporting an error"),
])
def test_a_failing_worker_ends_the_run_with_its_error(make_cfg, how, said):
    cfg = make_cfg(f"fault-{how}", rollout={**SMALL, "staleness": 1, "mode": "async"},
                   optim={"steps": 4}, debug={"rollout_worker_fault": [3, how]})
    start = time.monotonic()
    with pytest.raises(WorkerFailed, match=said):
        train(cfg)
    assert time.monotonic() - start < 120
    rows = untimed(Path(cfg.out_dir))
    assert [r["step"] for r in rows] == [1, 2]  # the steps before it were logged


def test_a_preempted_async_run_resumes_to_the_uninterrupted_one(make_cfg):
    """Cut after step 2 while the worker samples step 3 ahead: that rollout is lost and
    regenerated on resume, the same."""
    common = {"rollout": {**SMALL, "staleness": 2, "mode": "async"},
              "optim": {"steps": 4, "lr": 1e-2}}
    full = train(make_cfg("full", **common))
    cut = train(make_cfg("cut", debug={"stop_after_steps": 2}, **common))
    assert len(untimed(cut)) == 2
    resumed = train(make_cfg("cut", **common))
    assert_same_run(full, resumed, 4)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals a process group")
def test_sigterm_to_the_whole_job_saves_exits_75_and_resumes_the_same(make_cfg, tmp_path):
    """As a scheduler preempts: SIGTERM to every process of the job. The worker ignores it,
    the trainer saves its state at the step's end and exits 75 (the worker ended with it),
    and the rerun finishes equal to an uninterrupted run."""
    common = {"rollout": {**SMALL, "staleness": 1, "mode": "async"},
              "optim": {"steps": 5, "lr": 1e-2}}
    full = train(make_cfg("full", **common))
    cfg = make_cfg("preempted", debug={"sleep_per_step_s": 1.0}, **common)
    path = tmp_path / "preempted.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}  # as in-process
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "--config", str(path)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    metrics = Path(cfg.out_dir) / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.2)
    workers = {c for c in children(proc.pid) if is_worker(c)}
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=120) == 75, proc.stderr.read()
    assert (Path(cfg.out_dir) / "state").is_dir()
    assert not any(Path(f"/proc/{w}").exists() and is_worker(w) for w in workers)
    resumed = train(make_cfg("preempted", **common))
    assert_same_run(full, resumed, 5)


def children(pid: int) -> set[int]:
    out = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        out |= {int(c) for c in (task / "children").read_text().split()}
    return out


def is_worker(pid: int) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return False
    return "multiprocessing" in cmd and "resource_tracker" not in cmd


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_trainer_leaves_no_worker(make_cfg, tmp_path):
    cfg = make_cfg("killed", rollout={**SMALL, "staleness": 1, "mode": "async"},
                   optim={"steps": 50}, debug={"sleep_per_step_s": 1.0})
    path = tmp_path / "killed.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "--config", str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = Path(cfg.out_dir) / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 120
        while not (metrics.exists() and metrics.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, "no step was logged"
            time.sleep(0.2)
        workers = {c for c in children(proc.pid) if is_worker(c)}
        assert len(workers) == 1, children(proc.pid)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{w}").exists() and is_worker(w) for w in workers):
        assert time.monotonic() < deadline, f"worker {workers} outlived its trainer"
        time.sleep(0.1)


def test_the_worker_refuses_a_request_for_weights_it_does_not_hold(make_cfg):
    """The worker's own guard: a request tagged with another step than it holds fails
    there, and the trainer raises that error."""
    cfg = make_cfg("guard", rollout={**SMALL, "staleness": 1, "mode": "async"})
    trainer = Trainer(cfg)
    trainer.setup(track=False)
    worker = trainer.overlapped.worker
    try:
        worker._sent_step = 5  # the trainer believes it sent step 5; the worker holds 0
        with pytest.raises(WorkerFailed, match=r"wants the weights of step 5, the worker "
                                               r"holds step 0"):
            worker.generate([(["1+1"], 0)], n=1, temperature=1.0, top_p=1.0, max_new_tokens=2)
    finally:
        worker.close()
    assert not worker.process.is_alive()
    assert async_rollout.POLL_S < 1


def test_run_config_records_the_mode(make_cfg):
    cfg = make_cfg("mode", rollout={"staleness": 1, "mode": "async", "async_threads": 2})
    again = parse_run_config(cfg.model_dump(mode="json"), "test:again")
    assert (again.rollout.mode, again.rollout.async_threads) == ("async", 2)


def test_the_worker_gpus_are_the_jobs_last_ones():
    """rollout.gpus: the worker takes the node's last visible GPUs (SLURM sets the variable
    to the job's physical ids), after the trainer's ranks (cuda:0 .. local ranks - 1); it
    sets CUDA_VISIBLE_DEVICES to them before CUDA starts in its process."""
    assert async_rollout.worker_gpus(1, None, device_count=2, trainer_gpus=1) == "1"
    assert async_rollout.worker_gpus(1, "4,5,6", device_count=3, trainer_gpus=2) == "6"
    assert async_rollout.worker_gpus(2, "0,1,2,3,4,5,6,7", device_count=8,
                                     trainer_gpus=6) == "6,7"
    with pytest.raises(ValueError, match=r"rollout.gpus=2 and 2 trainer rank\(s\) on this "
                                         r"node need 4 GPUs, but the job sees 3"):
        async_rollout.worker_gpus(2, "4,5,6", device_count=3, trainer_gpus=2)


def test_rollout_gpus_is_refused_where_it_means_nothing(make_cfg):
    """GPUs for a worker that does not exist (sync), several for the hf engine (one GPU),
    or any on a CPU run: one line naming the field, before the run starts."""
    with pytest.raises(ValueError, match=r"rollout.gpus=1 gives GPUs to a rollout worker, "
                                         r"which only rollout.mode: async has"):
        make_cfg("sync-gpus", rollout={"gpus": 1})
    with pytest.raises(ValueError, match=r"rollout.gpus=2: the hf engine samples on one GPU"):
        make_cfg("hf-gpus", rollout={"staleness": 1, "mode": "async", "gpus": 2})
    cfg = make_cfg("cpu-gpus", rollout={**SMALL, "staleness": 1, "mode": "async", "gpus": 1})
    with pytest.raises(ValueError, match=r"rollout.gpus=1 needs GPUs, but the run is on cpu"):
        train(cfg)
