"""Every published interval and sentence can be recomputed from what a snapshot ships: a
report's tables/ folder alone (eval_metrics.csv, problem_scores.csv.gz, initial_metrics.csv)
gives back its Last/Best tables and contrasts, number for number, their renderings and
report.md's verdict, text for text; a changed number or an edited sentence is caught. Every
committed snapshot is checked the same way."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import warnings
from pathlib import Path

import pandas as pd
import pytest
from analysis_fixtures import summary, write_run
from test_contrasts import FRONTIER, _write

from analysis.__main__ import main
from analysis.recompute import recompute
from analysis.report import build_report, check_options
from common.layout import SweepDir

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("snapshot_tool", REPO / "tools" / "snapshot.py")
snapshot_tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(snapshot_tool)
refresh = snapshot_tool.refresh


@pytest.fixture()
def snapshot(tmp_path) -> Path:
    """A report of a 3-seed overlay with DAPO beside it, its tables/ copied where no run
    folder is."""
    root = _write(tmp_path / "sweep", FRONTIER)
    for seed, mean in enumerate((0.30, 0.35, 0.30)):
        write_run(root / "runs", f"dapo_s{seed}", "DAPO", seed, {}, evals={"toy": {20: mean}},
                  kls={"toy": {20: 0.5}})
    step0 = root / "initial" / "eval" / "step_0"
    step0.mkdir(parents=True)
    (step0 / "toy.json").write_text(json.dumps(summary("toy", 0, 0.20)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_report(check_options(root, root / "out"))
    snap = tmp_path / "snap"
    shutil.copytree(root / "out" / "tables", snap / "tables")
    shutil.copy(root / "out" / "report.md", snap / "report.md")
    return snap


def test_a_snapshot_recomputes_number_for_number(snapshot, capsys):
    scores = pd.read_csv(SweepDir(snapshot).problem_scores)
    assert list(scores.columns) == ["run_id", "step", "benchmark", "scorer", "problem_id",
                                    "correct", "samples"]
    assert len(scores) == 6 * 3 * 2 * 5  # runs x seeds x scorers x problems, one step
    results = recompute(snapshot)
    assert [name for name, _, _ in results] == [
        "eval_metrics.csv", "last_best_dapo.csv", "last_best_dapo.md", "last_best_dapo.tex",
        "last_best_math_verify.csv", "last_best_math_verify.md", "last_best_math_verify.tex",
        "contrasts.csv", "report.md"]
    assert all(count > 0 and diffs == [] for _, count, diffs in results)
    # the verdict, the contrasts' paragraph and table, two scorer tables and their
    # initial-model rows, the pass@k and maj@k tables
    assert dict((n, c) for n, c, _ in results)["report.md"] == 8
    assert "scores 20.00 on Toy" in (snapshot / "report.md").read_text()
    assert main(["recompute", str(snapshot)]) == 0
    assert "contrasts.csv: " in capsys.readouterr().out


def test_a_changed_number_is_caught(snapshot, capsys):
    _edit_csv(SweepDir(snapshot).tables / "contrasts.csv",
              lambda t: t.assign(delta_high=t["delta_high"].where(t.index != 0,
                                                                  t["delta_high"] + 0.01)))
    assert main(["recompute", str(snapshot)]) == 1
    out = capsys.readouterr().out
    assert "contrasts.csv: " in out and "1 differ" in out and "delta_high" in out


@pytest.mark.parametrize("edit", [
    ("report.md", "**Verdict**", "**Verdict** (edited)"),
    ("report.md", "detects on Toy", "detects on Toy, we think,"),
    ("tables/last_best_dapo.md", "| DAPO |", "| DAPO (ours) |"),
    ("tables/last_best_dapo.tex", "DAPO", "DAPO*"),
    ("tables/initial_metrics.csv", ",toy,dapo,", ",toy,dapo_x,"),
])
def test_an_edited_sentence_or_rendering_is_caught(snapshot, capsys, edit):
    name, old, new = edit
    path = snapshot / name
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    assert main(["recompute", str(snapshot)]) == 1
    # the initial model's scorer renamed: its table row and its pass@k row both differ
    assert re.search(r"[12] differ", capsys.readouterr().out)


def _edit_csv(path: Path, edit) -> None:
    table = pd.read_csv(path)
    table = edit(table)
    table.to_csv(path, index=False)


@pytest.mark.parametrize("file,edit,said", [
    ("last_best_dapo.csv", lambda t: t.assign(seeds=t["seeds"].where(t.index != 0, "0 1 3")),
     "seeds at"),
    ("last_best_dapo.csv", lambda t: t.assign(
        baseline=t["baseline"].where(t.index != len(t) - 1, "GRPO")), "baseline at"),
    ("last_best_dapo.csv", lambda t: t.drop(columns="delta_p_holm"),
     "the published table lacks ['delta_p_holm']"),
    ("contrasts.csv", lambda t: t.drop(columns="mdd"), "the published table lacks ['mdd']"),
])
def test_an_edited_text_column_or_a_dropped_column_is_caught(snapshot, capsys, file, edit, said):
    """Text columns are compared as text and the column sets must match: before, a changed
    seed list, a later row's baseline or a dropped column passed (only shared numbers were
    compared)."""
    _edit_csv(SweepDir(snapshot).tables / file, edit)
    assert main(["recompute", str(snapshot)]) == 1
    assert said in capsys.readouterr().out


def test_an_evaluation_mean_that_disagrees_with_its_scores_is_caught_at_any_step(snapshot,
                                                                              capsys):
    """eval_metrics.csv's means are checked against the per-problem scores at every step,
    not only where they feed a published number."""
    _edit_csv(SweepDir(snapshot).tables / "eval_metrics.csv",
              lambda t: t.assign(mean=t["mean"].where(t.index != 0, t["mean"] + 0.01)))
    assert main(["recompute", str(snapshot)]) == 1
    out = capsys.readouterr().out
    assert "eval_metrics.csv: " in out and "its per-problem scores give" in out


def test_a_sentence_before_the_verdict_on_its_line_is_caught(snapshot, capsys):
    """Only the cross-check's lead may stand before the verdict on its line."""
    report = snapshot / "report.md"
    text = report.read_text()
    report.write_text(text.replace("**Verdict**", "GRPO is clearly better than DAPO. "
                                                  "**Verdict**", 1))
    assert main(["recompute", str(snapshot)]) == 1
    assert "does not state the recomputed verdict" in capsys.readouterr().out
    report.write_text(text.replace("**Verdict**", "Cross-check: lighteval agrees with our "
                                   "math_verify Mean@n within sampling noise on all 2 checkpoint "
                                   "x benchmark pairs (see Concordance). **Verdict**", 1))
    assert main(["recompute", str(snapshot)]) == 0


def test_refresh_rewrites_what_recompute_checks(snapshot):
    # an older report's wording (here: an edited verdict and table) is rebuilt from the
    # snapshot's own files, every other line kept
    report = snapshot / "report.md"
    report.write_text(report.read_text().replace("**Verdict** (", "**Verdict** (old wording; ")
                      .replace("*Scorer dapo:", "*Scorer dapo (old caption):")
                      + "\nA hand-written line.\n")
    assert any(diffs for _, _, diffs in recompute(snapshot))
    done = refresh(snapshot)
    assert "report.md: the verdict" in done and "report.md: the `dapo` table" in done
    assert all(diffs == [] for _, _, diffs in recompute(snapshot))
    assert report.read_text().endswith("A hand-written line.\n")


def test_refresh_redraws_the_accuracy_figures_a_snapshot_ships(snapshot):
    """A shipped accuracy PNG is drawn again from the tables (an old one replaced); a
    scorer whose figure the snapshot does not ship gets none."""
    plots = snapshot / "plots"
    plots.mkdir()
    (plots / "accuracy_dapo.png").write_bytes(b"an old figure")
    done = refresh(snapshot)
    assert "plots/accuracy_dapo.png" in done
    assert (plots / "accuracy_dapo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in plots.iterdir()) == ["accuracy_dapo.png"]


def test_a_put_section_keeps_a_blank_line_before_the_next_heading():
    put = snapshot_tool.put_section
    text = "## A\n\nold\n\n## B\ntext\n"
    assert put(text, "## A", "## A\n\nnew", "## B") == "## A\n\nnew\n\n## B\ntext\n"
    assert put("x\n\n## B\ntext\n", "## A", "## A\n\nnew\n", "## B") == (
        "x\n\n## A\n\nnew\n\n## B\ntext\n")


def test_a_snapshot_without_scores_is_one_line(tmp_path, capsys):
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "eval_metrics.csv").write_text("run_id\n")
    assert main(["recompute", str(tmp_path)]) == 2
    assert "problem_scores.csv.gz is missing" in capsys.readouterr().err


SNAPSHOTS = sorted(p.name for p in (REPO / "docs" / "runs").iterdir() if p.is_dir())


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_every_published_snapshot_ships_its_scores_and_recomputes(name):
    snap = SweepDir(REPO / "docs" / "runs" / name)
    assert snap.problem_scores.is_file() and snap.initial_metrics.is_file(), (
        f"docs/runs/{name} ships no per-problem scores or warm start: rebuild it with "
        "tools/snapshot.py, or retire it")
    results = recompute(snap.root)
    assert results and all(diffs == [] for _, _, diffs in results), results
    assert "report.md" in [name for name, _, _ in results]
