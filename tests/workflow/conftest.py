"""Workflow fixtures."""

from pathlib import Path

import pytest
from workflow_helpers import REPO, micro_sweep, smk


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def finished(tmp_path_factory):
    """One real micro sweep (two methods, tiny model), shared by every test that reads a
    finished sweep (the end-to-end tests, the HTML report): CI runs it once."""
    root = tmp_path_factory.mktemp("sweep")
    config = micro_sweep(root, "micro", ["RPG-REINFORCE-URKL", "GRPO"])
    proc = smk(root, config)
    return root, config, proc
