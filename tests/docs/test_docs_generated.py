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


RUN_JSON = {"commit": "abc1234", "cpu": "AMD EPYC 7B13", "command": "snakemake -c all",
            "wall_s": 870.4, "aten_cpu_capability": None, "date": "2026-12-02"}
TABLE = "*Scorer dapo: a caption.*\n\n| Method | Toy Last |\n|---|---:|\n| DAPO | 32.02 ± 0.66 |\n"
REPORT = ("# Report: default\n\n**Verdict** (computed from the tables below): DAPO leads.\n\n"
          "### Scorer `dapo`\n\n" + TABLE + "\nThe model every run starts from:\n\n"
          "| Model | Toy |\n|---|---|\n| Initial model (step 0) | 17.77 |\n\n"
          "### Scorer `math_verify`\n\n| Model | Toy |\n|---|---|\n| Initial model (step 0) | 9.99 |\n")


def snapshot(root: Path, run: dict | None = RUN_JSON) -> Path:
    """A committed run snapshot as gen_docs reads it: run.json, tables/, report.md."""
    import json

    folder = root / gen_docs.DEFAULT_SNAPSHOT
    (folder / "tables").mkdir(parents=True)
    (folder / "tables" / "last_best_dapo.md").write_text(TABLE)
    (folder / "report.md").write_text(REPORT)
    if run is not None:
        (folder / "run.json").write_text(json.dumps(run))
    return folder


def test_readme_results_are_generated_from_the_named_run(tmp_path, monkeypatch):
    """The default's table (verbatim from the snapshot's tables/), its provenance sentence
    (command, commit, CPU, kernels, wall time), the initial model's row and the verdict."""
    snapshot(tmp_path)
    monkeypatch.setattr(gen_docs, "REPO", tmp_path)
    (tmp_path / "README.md").write_text(
        "# x\n\n<!-- generated:default-results -->\npasted 14 min 30 s\n"
        "<!-- /generated:default-results -->\n")
    assert "README.md: default-results" in gen_docs.stale_blocks(tmp_path, write=True)
    text = (tmp_path / "README.md").read_text()
    assert "pasted" not in text and TABLE in text
    assert ("Measured: `snakemake -c all` at commit `abc1234` on 2026-12-02, AMD EPYC 7B13, "
            "ATEN_CPU_CAPABILITY unset (the CPU's best kernels): **14 min 30 s** wall time"
            ) in text
    assert "| Initial model (step 0) | 17.77 |" in text and "9.99" not in text
    assert "> **Verdict** (computed from the tables below): DAPO leads." in text
    assert "[the run's report](docs/runs/default-host/report.md)" in text
    assert "README.md: default-results" not in gen_docs.stale_blocks(tmp_path)


def test_a_missing_snapshot_keeps_the_block_and_check_reports_it(tmp_path, monkeypatch, capsys):
    snapshot(tmp_path, run=None)
    monkeypatch.setattr(gen_docs, "REPO", tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text("<!-- generated:default-results -->\npasted\n"
                      "<!-- /generated:default-results -->\n")
    assert gen_docs.main([], repo=tmp_path) == 1  # rewriting cannot make it current
    assert gen_docs.main(["--check"], repo=tmp_path) == 1
    assert "pasted" in readme.read_text()
    err = capsys.readouterr().err
    assert ("README.md: default-results (not generated: docs/runs/default-host/run.json is "
            "missing") in err


def test_a_snapshot_without_a_provenance_key_is_refused(tmp_path, monkeypatch):
    snapshot(tmp_path, run={k: v for k, v in RUN_JSON.items() if k != "cpu"})
    monkeypatch.setattr(gen_docs, "REPO", tmp_path)
    with pytest.raises(SystemExit, match=r"run.json: lacks \['cpu'\]"):
        gen_docs.gen_default_results()


@pytest.mark.parametrize("extra, note", [
    ({}, ""),
    ({"load": "load average: 2.2"}, " (an upper bound: the machine was shared with other work; "
                                    "load averages in `run.json`)"),
    ({"load": "load average: 2.2", "machine": "idle"},
     " (an idle machine: nothing else ran beside the sweep; load averages in `run.json`)"),
    ({"machine": "shared"}, " (an upper bound: the machine was shared with other work)"),
])
def test_the_wall_time_says_whether_the_machine_was_idle(tmp_path, extra, note):
    """run.json's `machine` (or, without it, a recorded load: shared) decides what the
    provenance sentence says the wall time is worth."""
    folder = snapshot(tmp_path, run={**RUN_JSON, **extra})
    text = gen_docs.snapshot_results(folder, "docs/runs/default-host")
    assert f"**14 min 30 s** wall time{note}. Its table" in text


def test_an_unknown_machine_value_is_refused(tmp_path):
    folder = snapshot(tmp_path, run={**RUN_JSON, "machine": "busy"})
    with pytest.raises(SystemExit, match="machine is 'busy'; it is 'idle'"):
        gen_docs.snapshot_results(folder, "docs/runs/default-host")
