"""Fixtures of the fault drills: one tiny model per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability_helpers import TINY

from trainer.tiny import build_tiny


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", TINY, progress=False)
