"""The concordance statistic against hand-computed cases, the table's rows from a sweep
folder, and the report's first paragraph and section."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from analysis.concordance import Z95, collect_rows, compare, headline, noise_halfwidth, write
from analysis.report import build_report, check_options


def test_noise_halfwidth_by_hand():
    # 0.5 and 0.3 over 10 problems x 4 samples: var = (0.25 + 0.21) / 40 = 0.0115
    assert noise_halfwidth(0.5, 4, 0.3, 4, 10) == pytest.approx(1.959964 * math.sqrt(0.0115))
    assert noise_halfwidth(0.5, 4, 0.3, 4, 10) == pytest.approx(0.210183, abs=1e-6)
    # unequal n: 0.25 * 0.75 / (121 * 4) + 0.5 * 0.5 / (121 * 32)
    var = 0.1875 / 484 + 0.25 / 3872
    assert noise_halfwidth(0.25, 4, 0.5, 32, 121) == pytest.approx(Z95 * math.sqrt(var))
    assert noise_halfwidth(0.0, 4, 1.0, 4, 2) == 0.0  # both certain: no noise at all
    with pytest.raises(ValueError, match="problems=0"):
        noise_halfwidth(0.5, 4, 0.5, 4, 0)


def summary(mean: float, scorer: str, n: int = 4, problems: int = 10, sha: str = "a" * 64,
            stderr: float | None = 0.05, step: int = 100) -> dict:
    block = {"mean": mean, "mean_stderr": stderr}
    if scorer == "math_verify":
        block.update(mean_ci95_low=mean - 0.1, mean_ci95_high=mean + 0.1)
    return {"benchmark": "toy", "step": step, "num_problems": problems,
            "source": {"kind": "local", "sha256": sha}, "sampling": {"n": n},
            "scorers": {scorer: block}}


def test_compare_verdicts_by_hand():
    ours = summary(0.5, "math_verify")
    # 0.5 vs 0.3 (10 x 4): |d| = 0.2 <= 0.2102 -> agree
    row = compare(ours, summary(0.3, "lighteval_math_verify"), "GRPO", "grpo_s0")
    assert row.diff == pytest.approx(0.2) and row.agrees
    assert row.lighteval_low == pytest.approx(0.3 - Z95 * 0.05)
    assert (row.ours_low, row.ours_high) == (0.4, 0.6)
    # 0.5 vs 0.25: var = (0.25 + 0.1875) / 40, half-width 0.20498 < 0.25 -> disagree
    row = compare(ours, summary(0.25, "lighteval_math_verify"), "GRPO", "grpo_s0")
    assert row.noise == pytest.approx(0.204978, abs=1e-6) and not row.agrees
    # the same means on other problems are not comparable
    other = summary(0.5, "lighteval_math_verify", sha="b" * 64)
    row = compare(ours, other, "GRPO", "grpo_s0")
    assert row.diff == 0 and not row.same_problems and not row.agrees


def write_pair(sweep: Path, run_id: str, label: str, ours: float, theirs: float) -> None:
    run = sweep / "runs" / run_id
    (run / "eval" / "step_100").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"run_id": run_id, "label": label,
                                                     "seed": 0, "tags": {}}))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.1}) + "\n")
    (run / "DONE").write_text("")
    s = summary(ours, "math_verify")
    s["sampling"].update(temperature=1.0, max_new_tokens=48, template="dapo")
    (run / "eval" / "step_100" / "toy.json").write_text(json.dumps(s))
    le = sweep / "crosscheck" / "lighteval" / run_id / "step_100"
    le.mkdir(parents=True)
    (le / "toy.json").write_text(json.dumps(summary(theirs, "lighteval_math_verify")))
    (le / "toy.results.json").write_text("{}")  # lighteval's raw file: not a summary


@pytest.fixture
def sweep(tmp_path) -> Path:
    write_pair(tmp_path, "grpo_s0", "GRPO", 0.5, 0.3)      # agrees
    write_pair(tmp_path, "rpg_s0", "RPG-UFKL", 0.5, 0.25)  # disagrees
    return tmp_path


def test_rows_files_and_headline(sweep):
    rows = write(sweep)
    assert [(r.method, r.agrees) for r in rows] == [("GRPO", True), ("RPG-UFKL", False)]
    assert collect_rows(sweep) == rows
    table = (sweep / "crosscheck" / "concordance.md").read_text()
    assert "| GRPO | `grpo_s0` | toy | 100 | 10 | 50.00 [40.00, 60.00] (n=4) |" in table
    assert "| +25.00 | 20.50 | **DISAGREE** |" in table
    csv = (sweep / "crosscheck" / "concordance.csv").read_text().splitlines()
    assert len(csv) == 3 and csv[0].startswith("method,run_id,benchmark,step")
    first = headline(rows)[0]
    assert "beyond sampling noise on 1 of 2 pairs: RPG-UFKL (rpg_s0) toy step 100 (+25.00 pts" in first
    assert headline(rows[:1])[0].startswith("Cross-check: lighteval agrees")
    assert headline([]) == []


def test_report_flags_a_disagreement_in_its_first_paragraph(sweep, tmp_path):
    report = build_report(check_options(sweep, tmp_path / "out")).read_text()
    first_paragraph = report.split("\n\n")[1]
    assert first_paragraph.startswith("**Cross-check disagreement**")
    assert "## Concordance with lighteval" in report and "**DISAGREE**" in report


def test_report_without_crosscheck_says_nothing_of_it(sweep, tmp_path):
    import shutil

    shutil.rmtree(sweep / "crosscheck")
    report = build_report(check_options(sweep, tmp_path / "out")).read_text()
    assert "lighteval" not in report and "Cross-check" not in report
