"""The tables in docs/ that code can produce are the code's: `python tools/gen_docs.py --check`."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, Field

REPO = Path(__file__).resolve().parents[2]


def load_gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "tools" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen_docs = load_gen_docs()


def test_generated_blocks_in_the_docs_are_current():
    """Fails after a Field description, a default, the metric registry or the audit changes
    until `python tools/gen_docs.py` is run; also when a generator's markers vanished."""
    assert gen_docs.stale_blocks(REPO) == []


def page_with_block(tmp_path: Path, name: str, body: str) -> Path:
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text(f"# A page\n\n<!-- generated:{name} -->\n{body}<!-- /generated:{name} -->\nafter\n")
    return page


def test_a_stale_block_is_named_and_rewritten(tmp_path):
    page = page_with_block(tmp_path, "metrics", "| pasted | table |\n")
    stale = gen_docs.stale_blocks(tmp_path)
    assert "docs/page.md: metrics" in stale
    assert "(no page): run-config" in stale  # the other generators have no page here
    gen_docs.stale_blocks(tmp_path, write=True)
    text = page.read_text()
    assert "pasted" not in text and "| `acc_mean` | Training accuracy | higher |" in text
    assert text.endswith("<!-- /generated:metrics -->\nafter\n")
    assert "docs/page.md: metrics" not in gen_docs.stale_blocks(tmp_path)


def test_check_exits_1_naming_the_stale_block(tmp_path, capsys):
    page_with_block(tmp_path, "metrics", "old\n")
    assert gen_docs.main(["--check"], repo=tmp_path) == 1
    assert "stale generated block: docs/page.md: metrics" in capsys.readouterr().err


def test_an_unknown_block_name_is_an_error(tmp_path):
    page_with_block(tmp_path, "no-such-table", "x\n")
    with pytest.raises(SystemExit, match="docs/page.md: unknown generated block 'no-such-table'"):
        gen_docs.stale_blocks(tmp_path)


class Inner(BaseModel):
    """An inner section.

    Second paragraph, not shown.
    """

    k: int = Field(10, ge=1, description="every k steps")


class Outer(BaseModel):
    """A model documented the LossConfig way.

    mode: how it runs,
        continued here.
    """

    mode: Literal["a", "b"] = "a"
    limit: float | None = Field(None, gt=0, le=1, description="a fraction")
    names: list[int] = Field(default_factory=list)
    inner: Inner = Field(default_factory=Inner)
    grid: list[Inner | None] | None = None
    flag: bool = True


def test_config_rows_come_from_fields_docstrings_and_nested_sections():
    assert list(gen_docs.config_rows(Outer)) == [
        ["`mode`", "`a`", "`a` | `b`", "how it runs, continued here."],
        ["`limit`", "`null`", "float or `null` (> 0, <= 1)", "a fraction"],
        ["`names`", "`[]`", "list of int", ""],
        ["**`inner`**", "", "", "An inner section."],
        ["`inner.k`", "`10`", "int (>= 1)", "every k steps"],
        ["`grid`", "`null`", "list of (Inner or `null`) or `null`", ""],
        ["`grid[].k`", "`10`", "int (>= 1)", "every k steps"],
        ["`flag`", "`true`", "bool", ""],
    ]


def test_table_cells_escape_the_pipe():
    table = gen_docs.markdown_table(["a", "b"], [["KL(pi||ref)", "x"]], align="lr")
    assert table == "| a | b |\n| --- | ---: |\n| KL(pi\\|\\|ref) | x |\n"
