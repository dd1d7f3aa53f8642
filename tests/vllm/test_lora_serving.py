"""LoRA serving (`rollout.vllm_lora: adapters`, the default) through the trainer, its calls
recorded by a stand-in for `vllm.LLM` (CUDA sleep mode cannot run here), and the adapters'
hand-off folders, for real.

What is pinned: under model.lora the engine serves the adapters by default and sleeps at
level 1, so the base is pushed once per engine life and every step pushes only the adapters
(vLLM's level 2 frees the weights pool unsaved: an explicit level 2 re-pushes the base after
every sleep); the hand-off goes to /dev/shm when it has room for two pushes, else to
`<run>/adapter-push` with one log line; its folders are removed at close, at interpreter
exit, and, after a crash, by the next engine on the host.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_engine_lifecycle import RecordingLLM

import common.generation.vllm as vllm_engine
from common.generation.vllm import AdapterHandOff, sleep_level
from trainer.config import RolloutConfig, parse_run_config
from trainer.loop import Trainer
from trainer.tiny import TinyConfig, build_tiny

LORA_TINY = TinyConfig(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                       sft_steps=10, sft_batch_size=16, sft_lr=5e-3)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", LORA_TINY, progress=False)


class ServingLLM(RecordingLLM):
    """Answers like `vllm.LLM` with LoRA enabled; records (call, argument) in `calls`, and
    checks that each generate's adapter folder holds peft's files."""

    calls: list = []

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        type(self).calls = [("init", kwargs.get("enable_lora", False))]
        self.llm_engine.remove_lora = lambda i: self.calls.append(("remove_lora", i))
        self.llm_engine.engine_core = SimpleNamespace(
            shutdown=lambda: self.calls.append(("shutdown", None)))

    def _reload(self, weights_iterator):
        names = [n for n, _ in weights_iterator]
        assert not any("lora_" in n for n in names)  # the base, under the plain HF names
        self.calls.append(("push", len(names)))

    def generate(self, requests, params, use_tqdm=False, lora_request=None):
        assert lora_request is not None
        files = sorted(p.name for p in Path(lora_request.lora_path).iterdir())
        assert files == ["adapter_config.json", "adapter_model.safetensors"], files
        self.calls.append(("generate", lora_request.lora_int_id))
        return [SimpleNamespace(outputs=[
            SimpleNamespace(token_ids=[7] * (params.max_tokens - i), text="no answer",
                            finish_reason="stop", logprobs=None) for i in range(params.n)])
            for _ in requests]


@pytest.fixture
def serving_vllm(monkeypatch):
    import vllm

    monkeypatch.setattr(vllm, "LLM", ServingLLM)
    monkeypatch.setattr(vllm_engine, "vllm_on_cpu", lambda: False)  # sleep mode on
    return ServingLLM


def lora_trainer(tiny_dir, tmp_path, **rollout) -> Trainer:
    cfg = parse_run_config({
        "run_id": "lora", "out_dir": str(tmp_path / "runs" / "lora"), "seed": 0,
        "model": {"path": str(tiny_dir), "device": "cpu", "lora": {"rank": 4}},
        "method": {"name": "GRPO"},
        "rollout": {"engine": "vllm", "n": 4, "prompts_per_step": 2, "max_new_tokens": 6,
                    "overlong_buffer": 2, "dynamic_sampling": False, **rollout},
        "optim": {"steps": 3, "lr": 1e-3},
        "tracking": {"mlflow_uri": None, "progress": False}}, "test:lora")
    torch.manual_seed(0)
    trainer = Trainer(cfg)
    trainer.setup(track=False)
    return trainer


def test_the_default_serves_adapters_and_pushes_the_base_once(tiny_dir, tmp_path,
                                                              serving_vllm):
    trainer = lora_trainer(tiny_dir, tmp_path)
    engine = trainer.engine.engine
    for _ in range(3):
        trainer.step()
    calls = serving_vllm.calls
    assert calls[0] == ("init", True)  # vLLM's LoRA enabled
    assert [c for c in calls if c[0] == "sleep"] == [("sleep", 1)] * 4  # start-up + 3 steps
    assert len([c for c in calls if c[0] == "push"]) == 1  # the base, once
    assert [i for c, i in calls if c == "generate"] == [1, 2, 3]  # a new adapter each step
    # only the adapter served next is on disk, in its own folder under this engine's parent
    (parent,) = engine.hand_off.parents
    assert [p.name for p in parent.iterdir()] == ["push-4"]
    engine.close()
    assert not parent.exists()


def test_an_explicit_level_2_pushes_the_base_after_every_sleep(tiny_dir, tmp_path,
                                                               serving_vllm):
    """vLLM's level 2 frees the weights unsaved (its sleep-mode backend offloads the
    "weights" pool to host memory at level 1 only): the base must go in again."""
    trainer = lora_trainer(tiny_dir, tmp_path, vllm_sleep_level=2)
    for _ in range(2):
        trainer.step()
    calls = serving_vllm.calls
    assert {c for c in calls if c[0] == "sleep"} == {("sleep", 2)}
    assert len([c for c in calls if c[0] == "push"]) == 3  # set-up, then after each sleep
    trainer.engine.engine.close()


def test_sleep_level_defaults_follow_what_a_push_carries():
    assert RolloutConfig().vllm_lora == "adapters" and RolloutConfig().vllm_sleep_level is None
    assert sleep_level(None, serves_adapters=True) == 1
    assert sleep_level(None, serves_adapters=False) == 2  # a whole push after every update
    assert sleep_level(2, serves_adapters=True) == 2 and sleep_level(1, False) == 1


def test_the_hand_off_spills_to_the_run_when_dev_shm_is_short(tmp_path, caplog):
    """A push larger than half of /dev/shm's free space (the real one) goes to the run's
    folder on disk, said once; a small one stays in memory."""
    shm = vllm_engine.SHM
    if not shm.is_dir():
        pytest.skip("no /dev/shm on this host")
    hand_off = AdapterHandOff(tmp_path / "run")
    small = hand_off.folder(1000)
    assert small.parent.parent == shm
    free = shutil.disk_usage(shm).free
    with caplog.at_level(logging.WARNING, logger=vllm_engine.__name__):
        big = [hand_off.folder(free // 2 + 1) for _ in range(2)]
    assert all(f.parent.parent == tmp_path / "run" / "adapter-push" for f in big)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "--shm-size" in line and str(tmp_path / "run" / "adapter-push") in line
    hand_off.close()
    assert not small.parent.exists() and not big[0].parent.exists()


HOLDER = """
import os, signal, sys
from pathlib import Path
from common.generation.vllm import AdapterHandOff
h = AdapterHandOff(shm=Path(sys.argv[1]))
print(h.folder(10).parent, flush=True)
if sys.argv[2] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


def hold(root: Path, how: str) -> tuple[subprocess.CompletedProcess, Path]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run([sys.executable, "-c", HOLDER, str(root), how], capture_output=True,
                          text=True, timeout=120, env=env)
    return proc, Path(proc.stdout.strip())


def test_a_crashed_runs_folders_go_at_the_next_start_an_exiting_ones_at_exit(tmp_path):
    root = tmp_path / "shm"
    root.mkdir()
    proc, parent = hold(root, "exit")
    assert proc.returncode == 0 and parent.name.startswith("rpg-lora-")
    assert not parent.exists()  # removed at interpreter exit
    proc, parent = hold(root, "kill")
    assert proc.returncode == -signal.SIGKILL and parent.is_dir()  # no clean-up ran
    other_host = root / "rpg-lora-elsewhere-1-0"
    other_host.mkdir()
    fresh = AdapterHandOff(shm=root).folder(10)
    assert not parent.exists()  # the dead process's folder, removed by the next engine
    assert other_host.is_dir() and fresh.is_dir()  # another host's is not this host's to judge
