"""Shared fixtures: one tiny model per session (small SFT so plumbing tests stay fast)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.config import parse_run_config
from trainer.tiny import TinyConfig, build_tiny

# Small but real: a 1-layer Llama, 40 SFT steps (a few seconds). Accuracy is not the point
# of these tests; shapes, determinism, resume and fault handling are.
TEST_TINY = TinyConfig(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                       sft_steps=40, sft_batch_size=16, sft_lr=5e-3)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", TEST_TINY, progress=False)


@pytest.fixture
def make_cfg(tiny_dir, tmp_path):
    """A small run config (4 prompts x 4 samples, 24 new tokens) with overrides per section."""

    def make(run_id: str = "run", **sections):
        data = {
            "run_id": run_id, "out_dir": str(tmp_path / "runs" / run_id), "seed": 0,
            "model": {"path": str(tiny_dir), "device": "cpu"},
            # No dynamic sampling unless a test asks (None = the method's default): this
            # weak test model rarely mixes right and wrong answers in a group.
            "rollout": {"n": 4, "prompts_per_step": 4, "max_new_tokens": 24,
                        "overlong_buffer": 4, "dynamic_sampling": False},
            "optim": {"steps": 3, "lr": 1e-3},
            "tracking": {"mlflow_uri": None, "progress": False},
        }
        for key, value in sections.items():
            if isinstance(value, dict):
                data[key] = {**data.get(key, {}), **value}
            else:
                data[key] = value
        return parse_run_config(data, f"test:{run_id}")

    return make
