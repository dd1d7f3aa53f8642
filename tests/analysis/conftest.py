"""Fixtures of the analysis tests (the data lives in analysis_fixtures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from analysis_fixtures import write_sweep


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """The default fixture sweep at tmp_path/results/toy-sweep."""
    return write_sweep(tmp_path / "results" / "toy-sweep")
