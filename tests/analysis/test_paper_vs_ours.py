"""The paper comparison: parsing a setting, joining our Last/Best with the paper's numbers."""

from __future__ import annotations

import re
import warnings

import pytest
from analysis_fixtures import REFERENCE_CSV

from analysis.collect import collect
from analysis.paper import load_reference, paper_vs_ours, parse_paper_setting


def _col(sweep):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return collect(sweep)


def test_paper_setting_parsing():
    assert parse_paper_setting("model=Qwen3-4B, context=8k") == {
        "model": "Qwen3-4B",
        "context": "8k",
    }
    assert parse_paper_setting(None) is None
    with pytest.raises(ValueError, match="'size'"):
        parse_paper_setting("model=Qwen3-4B,size=8k")
    with pytest.raises(ValueError, match="key=value"):
        parse_paper_setting("Qwen3-4B")


def test_paper_vs_ours_join(sweep):
    col = _col(sweep)
    ref = load_reference(REFERENCE_CSV)
    comp = paper_vs_ours(col.eval, col.runs, ref, {"model": "Qwen3-4B", "context": "8k"})
    t = comp.table.set_index(["label", "benchmark"])
    # paper Table 3 GRPO aime24: Last 0.3750, Best 0.4396; ours 0.45 / 0.45
    g = t.loc[("GRPO", "aime24")]
    assert (g.paper_last, g.paper_best) == (0.3750, 0.4396)
    assert g.diff_last == pytest.approx(0.075) and g.diff_best == pytest.approx(0.0104)
    u = t.loc[("RPG-URKL", "aime24")]
    assert u.ours_last == pytest.approx(0.50) and u.ours_last_se == pytest.approx(0.10)
    assert u.diff_best == pytest.approx(0.55 - 0.5260)
    assert len(t) == 6  # 3 methods x aime24, amc23 (no aime25 in the sweep)
    assert any("RPG-UFKL" in note for note in comp.notes)  # paper methods we did not run


def test_paper_setting_ambiguous_or_absent(sweep):
    col = _col(sweep)
    ref = load_reference(REFERENCE_CSV)
    # model alone matches Tables 3, 5, 6 (8k, 4k, 2k), which share methods and benchmarks
    with pytest.raises(ValueError, match=r"tables \['3', '5', '6'\].*context= or table="):
        paper_vs_ours(col.eval, col.runs, ref, {"model": "Qwen3-4B"})
    ok = paper_vs_ours(col.eval, col.runs, ref, {"model": "Qwen3-4B", "context": "4k"})
    assert ok.table is not None and set(ok.table.label) == {"DAPO", "GRPO", "RPG-URKL"}
    assert ok.table.set_index(["label", "benchmark"]).loc[("DAPO", "amc23"), "paper_best"] == 0.9297
    # Table 7 (same setting) only has benchmarks this sweep lacks: said, not guessed
    t7 = paper_vs_ours(col.eval, col.runs, ref, {"model": "Qwen3-4B", "table": "7"})
    assert t7.table is None and "No (method, benchmark) pair" in t7.notes[-1]
    none = paper_vs_ours(col.eval, col.runs, ref, {"model": "Qwen3-4B", "context": "32k"})
    assert none.table is None
    assert re.search(r"No paper results match.*table=3,model=Qwen3-4B,context=8k", none.notes[0])
