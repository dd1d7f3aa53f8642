"""perf/rule_times.py on a constructed folder of Snakemake benchmark TSVs."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "perf" / "rule_times.py"
HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
RULES = '''rule train:
    output: "x"
    benchmark:
        f"{OUT}/benchmarks/train/{{run_id}}.tsv"
    shell: "true"


if GROUP == "checkpoint":
    rule evaluate:
        benchmark:
            f"{OUT}/benchmarks/eval/{{run_id}}/step_{{step}}_{{bench}}.tsv"


rule evaluate_initial:
    benchmark:
        f"{OUT}/benchmarks/eval/initial/step_0_{{bench}}.tsv"


rule report:
    benchmark:
        str(LAYOUT.benchmark("report"))
'''


def _load():
    spec = importlib.util.spec_from_file_location("rule_times", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _tsv(root: Path, rel: str, seconds: float, end: float, extra: str = "") -> None:
    path = root / "benchmarks" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    header = HEADER if not extra else HEADER.rstrip("\n") + "\tjobid\trule_name\n"
    row = f"{seconds}\t0:00:00\t1\t1\t1\t1\t0\t0\t0\t0" + (f"\t{extra}" if extra else "")
    path.write_text(header + row + "\n")
    os.utime(path, (end, end))


@pytest.fixture
def sweep(tmp_path):
    """train: 2 jobs (100 s, 60 s); evaluate: 3 jobs (10 s each); evaluate_initial: 1 (20 s);
    report: 1 (10 s); a 35 s job whose file, written with with --benchmark-extended, names its rule.
    Starts/ends (epoch s): the first train job runs 1000-1100, the report ends at 1250."""
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "all.smk").write_text(RULES)
    t = 1_000_000.0
    _tsv(tmp_path, "train/a_s0.tsv", 100, t + 1100)
    _tsv(tmp_path, "train/b_s0.tsv", 60, t + 1080)
    for i, end in enumerate((1120, 1130, 1140)):
        _tsv(tmp_path, f"eval/a_s0/step_{i}_toy.tsv", 10, t + end)
    _tsv(tmp_path, "eval/initial/step_0_toy.tsv", 20, t + 1040)
    _tsv(tmp_path, "report.tsv", 10, t + 1250)
    _tsv(tmp_path, "custom/x.tsv", 35, t + 1200, extra="7\tmlflow_sync")
    return tmp_path, rules


def test_rules_jobs_totals_shares_and_span(sweep):
    root, rules = sweep
    rt = _load()
    jobs = rt.read_jobs(root, rules)
    table = rt.summarize(jobs).set_index("rule")
    total = 160 + 30 + 20 + 10 + 35  # 255 s of job time
    assert table.loc["train"].tolist() == [2, 160.0, 80.0, pytest.approx(160 / total)]
    assert table.loc["evaluate"].tolist() == [3, 30.0, 10.0, pytest.approx(30 / total)]
    assert table.loc["evaluate_initial", "jobs"] == 1  # not a run called "initial"
    assert table.loc["mlflow_sync", "total_s"] == 35.0  # from the rule_name column
    assert list(table.index[:2]) == ["train", "mlflow_sync"]  # largest total first
    assert rt.span_s(jobs) == pytest.approx(1250 - 1000)  # train a starts at 1100 - 100


def test_cli_prints_the_table(sweep):
    root, rules = sweep
    out = subprocess.run([sys.executable, str(SCRIPT), str(root), "--rules", str(rules)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    lines = out.splitlines()
    assert lines[1].split() == ["train", "2", "160.0", "80.0", "62.7%"]
    assert "span, first start to last end: 250.0 s (4.2 min); sum / span = 1.02" in out
    bad = subprocess.run([sys.executable, str(SCRIPT), str(root / "nope")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no benchmark files under" in bad.stderr


def test_the_workflow_rules_are_parsed():
    """The shipped workflow's rules declare benchmark files this script can attribute."""
    rt = _load()
    rules = {p.rule for p in rt.rule_patterns(REPO / "workflow" / "rules")}
    assert {"train", "report"} <= rules
