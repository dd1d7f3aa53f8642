"""`snakemake --report results/<sweep>/report.html` on a finished micro sweep: one
self-contained HTML file holds report.md, every table and plot (with captions), the audit,
the paper's figures and one category per benchmark; on an unfinished or running sweep it
stops with one line that says so."""

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from workflow_helpers import REPO, micro_sweep, smk, snakemake_exe

pytestmark = pytest.mark.slow


def embedded(html: str, name: str) -> dict:
    """The JSON object the report's `<script id=name>` assigns (`var name = {...};`)."""
    match = re.search(rf'<script id="{name}">\s*var {name} = (.*?);\s*</script>', html, re.S)
    assert match, f"no <script id={name}> in the report"
    return json.loads(match.group(1))


def test_html_report_holds_tables_plots_audit_figures_per_benchmark(finished):
    root, config, _ = finished
    out = root / "results" / "micro"
    html_path = out / "report.html"
    smk(root, config, "--report", str(html_path))
    html = html_path.read_text()
    categories, results = embedded(html, "categories"), embedded(html, "results")

    def files(category):
        return {Path(p) for sub in categories[category].values() for p in sub}

    def written(folder):  # not Snakemake's own .snakemake_timestamp of a directory output
        return {p for p in (out / folder).iterdir() if not p.name.startswith(".")}

    assert files("Report") == {out / "report.md"}
    # every file the report rule wrote under tables/ and plots/, picked up by the pattern
    assert files("Tables") == written("tables")
    assert {p.name for p in files("Tables")} >= {"last_best_dapo.csv", "last_best_dapo.md",
                                                 "last_best_math_verify.tex", "runs.csv"}
    assert files("Plots") == written("plots")
    assert {p.name for p in files("Plots")} >= {"accuracy_dapo.png", "training.pdf"}
    assert {p.name for p in files("Audit")} == {"audit.md", "audit.csv"}
    assert {p.name for p in files("Paper figures")} == {"figure2_dual_clip.png",
                                                        "figure3_rpg_style_clip.png"}
    for bench in ("toy", "aime24"):
        per_run = categories[f"Benchmark {bench}"]
        assert set(per_run) == {"rpg-reinforce-urkl_s0", "grpo_s0", "initial model"}
        assert {Path(p).relative_to(out / "runs/grpo_s0") for p in per_run["grpo_s0"]} == {
            Path(f"eval/step_{s}/{bench}.json") for s in (2, 4)}
    # self-contained: the bytes themselves are embedded, with the captions
    for path in (out / "tables/last_best_dapo.csv", out / "plots/accuracy_dapo.png",
                 out / "report.md"):
        uri = results[str(path)]["data_uri"]
        assert base64.b64decode(uri.split(";base64,", 1)[1]) == path.read_bytes()
    table = results[str(out / "tables/last_best_dapo.csv")]
    assert table["labels"] == {"table": "last_best_dapo", "format": "csv"}
    assert "Table 3 layout" in table["caption"]
    assert "per benchmark against the training step" in results[str(out / "plots/accuracy_dapo.png")][
        "caption"]
    assert "sweep <strong>micro</strong>" in html  # workflow/report/workflow.rst, rendered


def test_report_on_an_unfinished_then_a_running_sweep_says_so_in_one_line(finished, tmp_path):
    root, _, _ = finished
    config = micro_sweep(tmp_path, "pending", ["GRPO"],
                         model=str(root / "results" / "micro" / "model"))
    target = str(tmp_path / "results/pending/report.html")
    proc = smk(tmp_path, config, "--report", target, check=False)
    assert proc.returncode != 0 and not Path(target).exists()
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert re.fullmatch(r"error: \S+/results/pending is not finished: \d+ of \d+ files of the "
                        r"report are missing \(the first: \S+\); run the sweep first .*",
                        proc.stderr.strip())

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    run = subprocess.Popen(
        [snakemake_exe(), "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path),
         "--configfile", str(config), "-c", "1"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        deadline = time.time() + 300
        while not list((tmp_path / ".snakemake/locks").glob("*.output.lock")):
            assert time.time() < deadline and run.poll() is None, "the sweep never started"
            time.sleep(0.2)
        proc = smk(tmp_path, config, "--report", target, check=False)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    assert proc.returncode != 0 and not Path(target).exists()
    line = proc.stderr.strip()
    assert line.splitlines() == [line]
    assert re.fullmatch(r"error: \S+/results/pending is being written by a Snakemake run "
                        r"\(lock \S+\.output\.lock\): wait for it to finish, .*--unlock.*", line)
