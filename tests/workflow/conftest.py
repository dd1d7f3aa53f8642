"""Workflow fixtures."""

from pathlib import Path

import pytest
from workflow_helpers import REPO


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO
