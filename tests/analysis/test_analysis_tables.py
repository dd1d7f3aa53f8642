"""Last/Best tables: numbers by hand, mean ± se over seeds, bold/underline, ties, paper join."""

from __future__ import annotations

import math
import re
import warnings

import pandas as pd
import pytest
from analysis_fixtures import REFERENCE_CSV, write_run

from analysis.collect import collect
from analysis.metrics import metric_meta
from analysis.tables import (
    last_best_table,
    load_reference,
    paper_vs_ours,
    parse_paper_setting,
    per_run_last_best,
    rank_marks,
    render_latex,
    render_markdown,
    write_last_best_tables,
)


def _col(sweep):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return collect(sweep)


def _cell(tidy, label, bench, stat):
    row = tidy[(tidy.label == label) & (tidy.benchmark == bench) & (tidy.stat == stat)]
    assert len(row) == 1
    return row.iloc[0]


def test_last_and_best_per_run_by_hand(sweep):
    runs = per_run_last_best(_col(sweep).eval, "dapo").set_index(["run_id", "benchmark"])
    # urkl_s0 aime24: 0.50 @10, 0.40 @20 -> Last 0.40 (step 20), Best 0.50 (step 10)
    r = runs.loc[("urkl_s0", "aime24")]
    assert (r["last"], r["best"], r.last_step, r.best_step) == (0.40, 0.50, 20, 10)
    r = runs.loc[("grpo_s0", "amc23")]  # 0.50, 0.65
    assert (r["last"], r["best"], r.best_step) == (0.65, 0.65, 20)
    mv = per_run_last_best(_col(sweep).eval, "math_verify").set_index(["run_id", "benchmark"])
    assert mv.loc[("urkl_s0", "aime24"), "best"] == pytest.approx(0.45)


def test_mean_and_se_over_two_seeds_by_hand(sweep):
    tidy = last_best_table(_col(sweep).eval, "dapo")
    # RPG-URKL aime24 Last: seeds 0.40, 0.60 -> mean 0.50; sd = 0.1414 -> se = sd/sqrt(2) = 0.10
    last = _cell(tidy, "RPG-URKL", "aime24", "last")
    assert last["mean"] == pytest.approx(0.50) and last.se == pytest.approx(0.10)
    assert last.n_seeds == 2 and last.seeds == "0 1"
    # Best: 0.50, 0.60 -> 0.55 ± 0.05
    best = _cell(tidy, "RPG-URKL", "aime24", "best")
    assert best["mean"] == pytest.approx(0.55) and best.se == pytest.approx(0.05)
    # amc23 Best: 0.80, 0.90 -> 0.85 ± 0.05
    assert _cell(tidy, "RPG-URKL", "amc23", "best")["mean"] == pytest.approx(0.85)
    one = _cell(tidy, "GRPO", "aime24", "last")
    assert one["mean"] == pytest.approx(0.45) and math.isnan(one.se) and one.n_seeds == 1
    assert set(tidy.n) == {4}
    assert list(tidy.benchmark.unique()) == ["aime24", "amc23"]
    assert "REINFORCE++" not in set(tidy.label)  # no evaluations


def _md_rows(md: str) -> dict[str, list[str]]:
    rows = {}
    for line in md.splitlines():
        if line.startswith("| ") and not line.startswith("| Method"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0]] = cells[1:]
    return rows


def test_markdown_marks_and_ties(sweep):
    md = render_markdown(last_best_table(_col(sweep).eval, "dapo"))
    assert "| Method | AIME24 Last | AIME24 Best | AMC23 Last | AMC23 Best |" in md
    rows = _md_rows(md)
    # AIME24 Last: URKL 50.00, DAPO 50.00 (tie, both bold), GRPO 45.00 (second, underlined)
    assert rows["RPG-URKL"][0] == "**50.00 ± 10.00**"
    assert rows["DAPO"][0] == "**50.00**"
    assert rows["GRPO"][0] == "<ins>45.00</ins>"
    # AIME24 Best: URKL 55.00 ± 5.00 and DAPO 55.00 tie; GRPO 45.00 second
    assert rows["RPG-URKL"][1] == "**55.00 ± 5.00**" and rows["DAPO"][1] == "**55.00**"
    # AMC23 Last: URKL 85.00, DAPO 70.00, GRPO 65.00 -> one bold, one underline, one plain
    assert rows["RPG-URKL"][2] == "**85.00 ± 5.00**"
    assert rows["DAPO"][2] == "<ins>70.00</ins>" and rows["GRPO"][2] == "65.00"
    assert list(rows) == ["DAPO", "GRPO", "RPG-URKL"]
    assert "percent" in md and "Mean@4" in md


def test_latex_marks(sweep):
    tex = render_latex(last_best_table(_col(sweep).eval, "dapo"), "t")
    row = next(line for line in tex.splitlines() if line.startswith("RPG-URKL"))
    cells = [c.strip() for c in row.removesuffix("\\\\").split("&")]
    assert cells[1] == "\\textbf{50.00 $\\pm$ 10.00}"
    assert cells[3] == "\\textbf{85.00 $\\pm$ 5.00}"
    grpo = next(line for line in tex.splitlines() if line.startswith("GRPO"))
    assert "\\underline{45.00}" in grpo
    assert "\\multicolumn{2}{c}{AIME24}" in tex and "\\cmidrule(lr){2-3}" in tex
    assert tex.count("\\begin{tabular}{lcccc}") == 1


def test_rank_marks_rules():
    acc = metric_meta("mean")
    assert rank_marks([0.5, 0.4, 0.4, 0.1], acc) == ["best", "second", "second", ""]
    assert rank_marks([0.5, 0.5, 0.4], acc) == ["best", "best", "second"]
    # ties are judged on the displayed numbers: 12.34 and 12.34
    assert rank_marks([0.123441, 0.123449, 0.1], acc) == ["best", "best", "second"]
    assert rank_marks([0.3, float("nan"), 0.2], acc) == ["best", "", "second"]
    assert rank_marks([0.3], acc) == [""]
    assert rank_marks([0.2, 0.2], acc) == ["best", "best"]
    # a lower-is-better metric ranks the other way; a diagnostic gets no marks
    assert rank_marks([0.1, 0.3, 0.2], metric_meta("extract_fail_rate")) == ["best", "", "second"]
    assert rank_marks([1.0, 2.0], metric_meta("entropy")) == ["", ""]


def test_written_files(sweep, tmp_path):
    files = write_last_best_tables(_col(sweep).eval, tmp_path / "tables")
    assert set(files) == {"dapo", "math_verify"}
    csv = pd.read_csv(files["math_verify"]["csv"])
    assert set(csv.columns) >= {"scorer", "label", "benchmark", "stat", "mean", "se", "n_seeds"}
    # math_verify = dapo - 0.05: GRPO aime24 Last 0.40
    v = csv[(csv.label == "GRPO") & (csv.benchmark == "aime24") & (csv.stat == "last")]["mean"]
    assert v.iloc[0] == pytest.approx(0.40)
    assert files["dapo"]["md"].read_text().count("\n| ") == 4
    assert "\\end{table}" in files["dapo"]["tex"].read_text()


def test_two_runs_with_one_label_and_seed_are_rejected(tmp_path):
    for rid, beta in (("a", "1e-3"), ("b", "1e-4")):
        write_run(
            tmp_path / "runs",
            rid,
            "RPG-URKL",
            0,
            {"method": "RPG-URKL", "beta": beta},
            evals={"aime24": {5: 0.5}},
        )
    with pytest.raises(ValueError, match=r"\['a', 'b'\] share label 'RPG-URKL'"):
        last_best_table(collect(tmp_path).eval, "dapo")


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
