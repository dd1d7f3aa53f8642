"""Stale and overlapped rollouts under FSDP2, for real: torchrun with 2 processes (gloo).

The lag is sharded like the policy (each rank queues its own slices); gathered whole after
every step it is the weights of the step it says it holds. An async run at world size 2
(rank 0's worker samples every rank's share) writes the simulated run's metrics and ends
on its weights exactly; a preempted staleness run resumes to the uninterrupted one from
its sharded state.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from test_fsdp_cpu import ENV, HERE, TORCHRUN, metrics, run, write_config

pytestmark = pytest.mark.slow

SMALL = {"rollout": {"n": 4, "prompts_per_step": 2, "max_new_tokens": 12,
                     "overlong_buffer": 4, "dynamic_sampling": False}}


def untimed(run_dir) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time_") and k != "tokens_per_sec"}
            for r in metrics(run_dir)]


def same_checkpoint(a, b) -> bool:
    x, y = (load_file(d / "checkpoints" / "step_4" / "model.safetensors") for d in (a, b))
    return sorted(x) == sorted(y) and all(torch.equal(x[k], y[k]) for k in x)


def test_the_sharded_lag_holds_the_weights_of_the_step_it_names(tiny_dir, tmp_path):
    cfg = write_config(tmp_path, "lag", model_path=tiny_dir,
                       rollout={**SMALL["rollout"], "staleness": 2},
                       optim={"steps": 4, "lr": 1e-2})
    proc = subprocess.run([*TORCHRUN, str(HERE / "staleness_probe.py"), str(cfg),
                           str(tmp_path / "probe")], env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "probe" / "lag.json").read_text())
    assert [r["holds"] for r in rows] == [0, 0, 1, 2]  # theta_{max(t-2, 0)} after t pushes
    assert all(r["names"] and r["equal"] for r in rows), rows
    assert all(r["moved"] for r in rows)  # the trained weights left the lag's behind


@pytest.mark.parametrize("k", [1, 2])
def test_async_at_world_size_2_equals_the_simulated_staleness(tiny_dir, tmp_path, k):
    common = dict(model_path=tiny_dir, optim={"steps": 4, "lr": 1e-2},
                  checkpoint={"eval_steps": [4]})
    runs = {}
    for mode in ("sync", "async"):
        cfg = write_config(tmp_path, f"{mode}{k}", **common,
                           rollout={**SMALL["rollout"], "staleness": k, "mode": mode})
        proc = run([*TORCHRUN, "-m", "trainer", "--config", str(cfg)], timeout=400)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[mode] = tmp_path / "runs" / f"{mode}{k}"
    assert untimed(runs["async"]) == untimed(runs["sync"])
    rows = untimed(runs["async"])
    assert [r["rollout_weights_step"] for r in rows] == [max(t - 1 - k, 0) for t in (1, 2, 3, 4)]
    assert all(r["groups_kept"] == 2 and r["grad_norm"] > 0 for r in rows)
    assert same_checkpoint(runs["sync"], runs["async"])


def test_a_rank_waits_for_long_work_in_align_not_in_a_collective(tmp_path):
    """With RPG_COLLECTIVE_TIMEOUT_S=3, a collective that waits 8 s for rank 0 fails; the
    same wait in `distributed.align` first, then the collective, succeeds."""
    env = {**ENV, "RPG_COLLECTIVE_TIMEOUT_S": "3"}
    out = {}
    for how in ("plain", "align"):
        out[how] = subprocess.run([*TORCHRUN, str(HERE / "wait_probe.py"), how], env=env,
                                  capture_output=True, text=True, timeout=120)
    assert out["align"].returncode == 0, out["align"].stderr[-3000:]
    assert out["align"].stdout.count("sum 2") == 2
    assert out["plain"].returncode != 0 and "sum 2" not in out["plain"].stdout
    assert re.search(r"[Tt]imed out|timeout", out["plain"].stderr), out["plain"].stderr[-3000:]


def test_async_with_a_3_s_collective_timeout_and_an_8_s_rollout_equals_the_simulated_run(
        tiny_dir, tmp_path):
    """The other rank waits 8 s for rank 0's worker at every generate, past a 3 s collective
    timeout, as it waits for hours at the paper's sizes: the run completes and equals the
    simulated staleness run."""
    env = {**ENV, "RPG_COLLECTIVE_TIMEOUT_S": "3"}
    common = dict(model_path=tiny_dir, optim={"steps": 3, "lr": 1e-2},
                  checkpoint={"eval_steps": [3]})
    runs = {}
    for mode, debug in (("sync", {}), ("async", {"rollout_delay_s": 8})):
        cfg = write_config(tmp_path, f"slow-{mode}", **common, debug=debug,
                           rollout={**SMALL["rollout"], "staleness": 1, "mode": mode})
        proc = subprocess.run([*TORCHRUN, "-m", "trainer", "--config", str(cfg)], env=env,
                              capture_output=True, text=True, timeout=400)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[mode] = tmp_path / "runs" / f"slow-{mode}"
    assert untimed(runs["async"]) == untimed(runs["sync"])
    assert min(r["time_rollout"] for r in metrics(runs["async"])[1:]) > 3  # it did wait


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_resumed_staleness_run_equals_an_uninterrupted_one_at_world_size_2(tiny_dir, tmp_path,
                                                                             mode):
    """The sharded state holds the lag's copy and its waiting slices (DTensors, so DCP
    reshards them): cut after step 2, two snapshots waiting, and resumed."""
    sections = dict(model_path=tiny_dir, optim={"steps": 4, "lr": 1e-2},
                    checkpoint={"eval_steps": [4]},
                    rollout={**SMALL["rollout"], "staleness": 2, "mode": mode})
    for name, debug in (("whole", {}), ("cut", {"stop_after_steps": 2}), ("cut", {})):
        cfg = write_config(tmp_path, name, **sections, debug=debug)
        proc = run([*TORCHRUN, "-m", "trainer", "--config", str(cfg)], timeout=400)
        assert proc.returncode == 0, proc.stderr[-3000:]
        if debug:
            assert len(metrics(tmp_path / "runs" / name)) == 2
    whole, cut = tmp_path / "runs" / "whole", tmp_path / "runs" / "cut"
    assert untimed(cut) == untimed(whole)
    assert same_checkpoint(whole, cut)


def test_a_sharded_staleness_state_resumes_at_world_size_1(tiny_dir, tmp_path):
    """DCP reshards the lag's slices: a world-size-2 state resumes in one process."""
    sections = dict(model_path=tiny_dir, optim={"steps": 3, "lr": 1e-2},
                    rollout={**SMALL["rollout"], "staleness": 1})
    cfg = write_config(tmp_path, "reshard", **sections, debug={"stop_after_steps": 2})
    proc = run([*TORCHRUN, "-m", "trainer", "--config", str(cfg)], timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = write_config(tmp_path, "reshard", **sections)
    proc = run([sys.executable, "-m", "trainer", "--config", str(cfg)], timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["step"] for r in metrics(tmp_path / "runs" / "reshard")] == [1, 2, 3]
    assert "resuming" in proc.stdout
