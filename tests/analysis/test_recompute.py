"""Every published interval can be recomputed from what a snapshot ships: a report's tables/
folder alone (eval_metrics.csv, problem_scores.csv.gz) gives back its Last/Best tables and
contrasts, number for number; a changed number is caught. The committed snapshots README
quotes are checked the same way."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pandas as pd
import pytest
from analysis_fixtures import write_run
from test_contrasts import FRONTIER, _write

from analysis.__main__ import main
from analysis.recompute import recompute
from analysis.report import build_report, check_options
from common.layout import SweepDir

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def snapshot(tmp_path) -> Path:
    """A report of a 3-seed overlay with DAPO beside it, its tables/ copied where no run
    folder is."""
    root = _write(tmp_path / "sweep", FRONTIER)
    for seed, mean in enumerate((0.30, 0.35, 0.30)):
        write_run(root / "runs", f"dapo_s{seed}", "DAPO", seed, {}, evals={"toy": {20: mean}},
                  kls={"toy": {20: 0.5}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_report(check_options(root, root / "out"))
    snap = tmp_path / "snap"
    shutil.copytree(root / "out" / "tables", snap / "tables")
    return snap


def test_a_snapshot_recomputes_number_for_number(snapshot, capsys):
    scores = pd.read_csv(SweepDir(snapshot).problem_scores)
    assert list(scores.columns) == ["run_id", "step", "benchmark", "scorer", "problem_id",
                                    "correct", "samples"]
    assert len(scores) == 6 * 3 * 2 * 5  # runs x seeds x scorers x problems, one step
    results = recompute(snapshot)
    assert [name for name, _, _ in results] == ["last_best_dapo.csv",
                                                "last_best_math_verify.csv", "contrasts.csv"]
    assert all(count > 0 and diffs == [] for _, count, diffs in results)
    assert main(["recompute", str(snapshot)]) == 0
    assert "contrasts.csv: " in capsys.readouterr().out


def test_a_changed_number_is_caught(snapshot, capsys):
    path = SweepDir(snapshot).tables / "contrasts.csv"
    table = pd.read_csv(path)
    table.loc[0, "delta_high"] += 0.01
    table.to_csv(path, index=False)
    assert main(["recompute", str(snapshot)]) == 1
    out = capsys.readouterr().out
    assert "contrasts.csv: " in out and "1 differ" in out and "delta_high" in out


def test_a_snapshot_without_scores_is_one_line(tmp_path, capsys):
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "eval_metrics.csv").write_text("run_id\n")
    assert main(["recompute", str(tmp_path)]) == 2
    assert "problem_scores.csv.gz is missing" in capsys.readouterr().err


# every docs/runs snapshot that ships its per-problem scores (docs/results.md's table says
# which); README's and the frontier's among them
WITH_SCORES = sorted(p.name for p in (REPO / "docs" / "runs").iterdir()
                     if (p / "tables" / "problem_scores.csv.gz").is_file())


def test_the_quoted_snapshots_ship_their_scores():
    assert {"default-host", "default-aten-default", "frontier"} <= set(WITH_SCORES)


@pytest.mark.parametrize("name", WITH_SCORES)
def test_the_published_snapshots_readme_quotes_recompute(name):
    results = recompute(REPO / "docs" / "runs" / name)
    assert results and all(diffs == [] for _, _, diffs in results), results
