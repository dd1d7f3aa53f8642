"""README's results block from a real finished sweep: the snapshot format that
docs/runs/<name>/ commits (run.json + the sweep's tables/ and report.md, copied verbatim) is
what tools/gen_docs.py renders. Reads the session's shared micro sweep (conftest `finished`)."""

import importlib.util
import json
import shutil

from workflow_helpers import REPO

from analysis.tables import table_stem
from common.layout import SweepDir


def load_gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "tools" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_block_is_built_from_a_finished_sweeps_snapshot(finished, tmp_path, monkeypatch):
    root, config, _ = finished
    sweep = SweepDir(root / "results" / "micro")
    gen_docs = load_gen_docs()
    snap = SweepDir(tmp_path / gen_docs.DEFAULT_SNAPSHOT)
    shutil.copytree(sweep.tables, snap.tables)
    shutil.copy(sweep.report, snap.report)
    (snap.root / "run.json").write_text(json.dumps({
        "commit": "0000000", "cpu": "test CPU", "command": f"snakemake -c 2 --configfile {config.name}",
        "wall_s": 61, "aten_cpu_capability": "default", "date": "today"}))
    monkeypatch.setattr(gen_docs, "REPO", tmp_path)
    block = gen_docs.gen_default_results()
    table = (sweep.tables / f"{table_stem('dapo')}.md").read_text()
    assert table.rstrip("\n") in block
    assert "ATEN_CPU_CAPABILITY default: **1 min 1 s** wall time" in block
    report = sweep.report.read_text()
    verdict = next(line for line in report.splitlines() if line.startswith("**Verdict**"))
    assert f"> {verdict}" in block
    initial = [line for line in block.splitlines() if line.startswith("| Initial model (step 0)")]
    assert len(initial) == 1 and initial[0] in report
