"""docs/paper-settings.md is true: each row's "ours" value is what config/paper.yaml resolves to."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from sweep.expand import expand
from sweep.runconfig import run_config
from sweep.spec import load_sweep
from trainer.config import parse_run_config

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "paper-settings.md"
SWEEP = load_sweep(REPO / "config" / "paper.yaml")


def rows() -> list[tuple[str, str, str]]:
    """(method, key, ours) of every table row."""
    out = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[1].startswith("`"):
            out.append((cells[0], cells[1].strip("`"), cells[4].strip("`")))
    return out


def resolved(method: str):
    """The run config of `method`'s first cell in config/paper.yaml (every registered method
    gets a cell: the table may name one that the sweep's method list leaves out)."""
    sweep = SWEEP.model_copy(update={"methods": [method], "seeds": [0]})
    cells, _ = expand(sweep)
    return parse_run_config(run_config(sweep, cells[0]), f"config/paper.yaml:{method}")


def lookup(method: str, key: str):
    if method == "sweep":
        obj = SWEEP
    else:
        cfg = resolved(method)
        obj = cfg.resolved_method() if key.startswith("method.") else cfg
        key = key.removeprefix("method.") if key.startswith("method.") else key
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


ROWS = rows()


def test_the_table_has_rows():
    assert len(ROWS) >= 40
    assert len({(m, k) for m, k, _ in ROWS}) == len(ROWS), "a (method, key) row is repeated"


@pytest.mark.parametrize("method, key, ours", ROWS, ids=[f"{m}:{k}" for m, k, _ in ROWS])
def test_row_matches_the_resolved_paper_config(method, key, ours):
    assert lookup(method, key) == yaml.safe_load(ours)


def test_the_doc_reads_no_placeholder():
    assert not re.search(r"\bTODO\b|\?\?", DOC.read_text())
