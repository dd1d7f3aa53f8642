"""The cross-check tests. Tests marked `lighteval` build lighteval's own environment
(minutes, network to a package index) and run only when selected: `pytest -m lighteval`."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    if "lighteval" in (config.getoption("markexpr") or ""):
        return
    opt_in = pytest.mark.skip(reason="builds lighteval's environment; select with -m lighteval")
    for item in items:
        if "lighteval" in item.keywords:
            item.add_marker(opt_in)
