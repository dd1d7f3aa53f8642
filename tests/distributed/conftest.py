"""One tiny model for the distributed tests (the trainer tests' small configuration)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.tiny import TinyConfig, build_tiny

DIST_TINY = TinyConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                       sft_steps=40, sft_batch_size=16, sft_lr=5e-3)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", DIST_TINY, progress=False)
