"""report.md end to end: tables, links that exist, audit/figures embedding, paper section, CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from analysis_fixtures import REFERENCE_CSV, summary, write_run, write_sweep
from matplotlib.figure import Figure

from analysis.__main__ import main
from analysis.report import build_report, check_options

REPO = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _build(sweep, out, **kw) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = build_report(check_options(sweep, out, **kw))
    assert path == out / "report.md"
    return path.read_text()


def _assert_links_exist(md: str, base: Path) -> list[str]:
    targets = LINK.findall(md)
    assert targets
    for t in targets:
        assert (base / t).is_file(), t
    return targets


def _extras(tmp_path: Path) -> tuple[Path, Path]:
    audit = tmp_path / "audit"
    (audit / "img").mkdir(parents=True)
    fig = Figure()
    fig.add_subplot().plot([0, 1])
    fig.savefig(audit / "img" / "grad.png")
    (audit / "audit.md").write_text(
        "# Exact-gradient audit\n\n| loss | max abs err |\n|---|---|\n| RPG-URKL | 1e-7 |\n\n"
        "![gradients](img/grad.png)\n\n```\n# a comment in code, not a heading\n```\n"
    )
    figures = tmp_path / "figures"
    figures.mkdir()
    fig.savefig(figures / "figure2.png")
    fig.savefig(figures / "figure2.pdf")
    return audit, figures


@pytest.fixture(scope="module")
def full_report(tmp_path_factory) -> tuple[Path, str]:
    """One report of the default sweep with audit, figures and the paper's 8k setting
    (built once: rendering six figures is the slow part of this file)."""
    tmp = tmp_path_factory.mktemp("full")
    sweep = write_sweep(tmp / "results" / "toy-sweep")
    audit, figures = _extras(tmp)
    out = tmp / "report"
    md = _build(
        sweep,
        out,
        audit_dir=audit,
        figures_dir=figures,
        paper_setting="model=Qwen3-4B,context=8k",
        reference=REFERENCE_CSV,
    )
    return out, md


def test_report_runs_section(full_report):
    _, md = full_report
    assert md.startswith("# Report: toy-sweep")
    assert "5 run(s) collected, 5 complete (DONE), 4 with evaluations" in md
    assert "Runs without evaluations: `rpp_s0`." in md
    assert "config.yaml is missing" in md and "urkl_s1" in md  # collection warnings shown
    # the run table aggregates per the registry: time_step is summed (3 steps x 1.5 s)
    assert "| `grpo_s0` | GRPO | 0 | 3 | yes | 10, 20 | 4.50 | 0 | 3 |" in md


def test_report_tables_and_links_exist(full_report):
    out, md = full_report
    # both scorers' tables, with the marks computed in test_analysis_tables
    assert "### Scorer `dapo`" in md and "### Scorer `math_verify`" in md
    # seed intervals (clipped to 0-100) and Δ vs DAPO from the per-sample records (by hand in
    # test_analysis_tables): one seed pairs with DAPO, so no interval
    assert ("| RPG-URKL | **50.00 ± 10.00 [0.00, 100.00]** | -10.00 | "
            "**55.00 ± 5.00 [0.00, 100.00]** | -5.00 |") in md
    targets = _assert_links_exist(md, out)
    for rel in (
        "tables/last_best_dapo.tex",
        "tables/last_best_math_verify.csv",
        "plots/accuracy_dapo.png",
        "plots/training.pdf",
        "tables/train_metrics.csv",
        "tables/paper_vs_ours.csv",
    ):
        assert rel in targets, rel


def test_report_embeds_audit_and_figures(full_report):
    out, md = full_report
    targets = _assert_links_exist(md, out)
    # the audit is embedded with demoted headings and rebased links; fenced code untouched
    assert md.count("Exact-gradient audit") == 1 and "| RPG-URKL | 1e-7 |" in md
    assert "## Exact-gradient audit\n\n| loss |" in md  # the embedded title is not repeated
    assert "../audit/img/grad.png" in targets
    assert "\n# a comment in code, not a heading\n" in md
    assert "../figures/figure2.png" in targets and "../figures/figure2.pdf" in targets


def test_report_paper_vs_ours(full_report):
    _, md = full_report
    # GRPO AIME24: paper Last 37.50 / Best 43.96, ours 45.00 / 45.00
    assert "| GRPO | AIME24 | 37.50 | 45.00 | +7.50 | 43.96 | 45.00 | +1.04 |" in md
    assert "| RPG-URKL | AIME24 | 45.42 | 50.00 ± 10.00 | +4.58 |" in md
    assert "Paper methods not in this sweep: " in md


def test_report_without_evaluations(tmp_path):
    write_run(tmp_path / "runs", "a", "GRPO", 0, {"method": "GRPO"}, done=False)
    md = _build(tmp_path, tmp_path)
    assert "No evaluation summaries yet" in md and "Runs without evaluations: `a`." in md
    assert "| `a` | GRPO | 0 | 3 | no | none |" in md
    assert "No paper setting declared" in md
    _assert_links_exist(md, tmp_path)
    md = _build(
        tmp_path,
        tmp_path / "s",
        paper_setting="model=Qwen3-4B,context=32k",
        reference=REFERENCE_CSV,
    )
    assert "No paper results match the setting `model=Qwen3-4B, context=32k`" in md


def test_bad_options_fail_before_writing(sweep, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="'ctx'"):
        check_options(sweep, out, paper_setting="model=Qwen3-4B,ctx=8k")
    with pytest.raises(FileNotFoundError, match="--audit-dir"):
        check_options(sweep, out, audit_dir=tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="paper reference"):
        check_options(sweep, out, paper_setting="model=Qwen3-4B", reference=tmp_path / "x.csv")
    assert main(["report", "--sweep-dir", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert not out.exists()
    assert main(["nonsense"]) == 2


def report_cli(sweep, out, *args: str) -> subprocess.CompletedProcess:
    """`python -m analysis report` in a subprocess, as Snakemake's report rule calls it."""
    return subprocess.run(
        [sys.executable, "-m", "analysis", "report", "--sweep-dir", str(sweep), "--out",
         str(out), *args],
        capture_output=True, text=True, cwd=REPO, timeout=120)


def test_cli_end_to_end(sweep, tmp_path):
    out = tmp_path / "cli"
    proc = report_cli(sweep, out, "--paper-setting", "model=Qwen3-4B,context=8k",
                      "--reference", str(REFERENCE_CSV), "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"wrote {out / 'report.md'}"
    md = (out / "report.md").read_text()
    assert "## Paper vs ours" in md and "| DAPO | AIME24 | 54.38 | 50.00 |" in md
    _assert_links_exist(md, out)
    bad = report_cli(sweep, tmp_path / "bad", "--paper-setting", "modl=Qwen3-4B")
    assert bad.returncode == 2 and "'modl'" in bad.stderr
    assert not (tmp_path / "bad").exists()


def test_figures_command_forwards_its_arguments(capsys):
    # `--help` must reach analysis.figures' own parser untouched (its prog name proves it)
    with pytest.raises(SystemExit) as exc:
        main(["figures", "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python -m analysis figures")


def test_report_run_table_shows_running_totals_once(tmp_path):
    """nonfinite_skips is a running total: a run that logged 0, 1, 1 skipped one update (the
    report used to sum it to 2)."""
    run = write_run(tmp_path / "runs", "a", "GRPO", 0, {"method": "GRPO"})
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for row, total in zip(lines, (0, 1, 1)):
        row["nonfinite_skips"] = total
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    md = _build(tmp_path, tmp_path)
    assert "| `a` | GRPO | 0 | 3 | yes | none | 4.50 | 1 | 3 |" in md


def test_report_shows_the_initial_model_row(tmp_path):
    """The gain is visible: the initial model's step-0 Mean@n sits under each table."""
    write_run(tmp_path / "runs", "a", "GRPO", 0, {"method": "GRPO"}, evals={"toy": {10: 0.5}})
    initial = tmp_path / "initial" / "eval" / "step_0"
    initial.mkdir(parents=True)
    (initial / "toy.json").write_text(json.dumps(summary("toy", 0, 0.125)))
    md = _build(tmp_path, tmp_path)
    assert "| Initial model (step 0) | 12.50 |" in md
    assert md.index("| GRPO | 50.00 ± n/a | 50.00 ± n/a |") < md.index(
        "| Initial model (step 0) | 12.50 |")
    # ... and in the verdict: the warm start's score and the gain over it (no DAPO to compare)
    assert md.split("\n")[2] == (
        "**Verdict** (computed from the tables below: scorer `dapo`, Mean@4 at Last, 1 seed(s) "
        "per method; Δ = method - DAPO (percentage points), paired by seed with the training "
        "run as the unit, with its 95% paired t interval over seeds; K = 0 comparison(s) at "
        "Last, read through Holm's adjustment: a finding is a Δ whose interval excludes 0 and "
        "whose Holm p is below 0.05). On Toy, DAPO was not evaluated, so no method is compared "
        "with it. "
        "The warm start (the initial model, before any RL step) scores 12.50 on Toy; gain at "
        "Last over it: GRPO +37.50. Grader check: on Toy the lenient `math_verify` less the "
        "strict `dapo` is -5.00 points at the warm start and at most -5.00 in any run at Last, "
        "so no run games it (10.00 points, 2 of a run's 20 answers, more than the warm start "
        "would flag one).")


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_evaluation_is_named_and_the_report_still_writes(tmp_path, bad):
    """A failed evaluation (mean NaN or inf at a run's last step) used to abort the whole
    report (seed_interval: "needs ... finite numbers"); now it is left out of the tables
    with a warning that names the run, the step and the scorer."""
    root = tmp_path / "sweep"
    for label in ("DAPO", "GRPO"):
        for seed, mean in enumerate((0.30, 0.35, 0.32)):
            write_run(root / "runs", f"{label.lower()}_s{seed}", label, seed, {},
                      evals={"toy": {10: mean, 20: mean}})
    path = sorted((root / "runs" / "grpo_s1").rglob("toy.json"))[-1]
    data = json.loads(path.read_text())
    for block in data["scorers"].values():
        block["mean"] = bad
    path.write_text(json.dumps(data))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = build_report(check_options(root, root / "out")).read_text()
    assert (f"run grpo_s1: its step 20 evaluation on toy has mean {bad!r} for scorer 'dapo', "
            "not a finite number: a failed evaluation, left out of every table") in report
    assert "**Verdict**" in report
