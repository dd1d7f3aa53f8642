"""Fixtures for the eval tests: benchmark files and a tiny HF checkpoint built locally."""

from __future__ import annotations

from pathlib import Path

import pytest
from _eval_tiny import BENCHMARK_DIR, build_tiny_checkpoint


@pytest.fixture(scope="session")
def benchmark_dir() -> Path:
    if not BENCHMARK_DIR.is_dir():
        pytest.fail(f"bundled benchmark data not found at {BENCHMARK_DIR.resolve()}")
    return BENCHMARK_DIR


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A random-init 2-layer Llama + BPE tokenizer with a chat template (~5 s to build)."""
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "step_7")
