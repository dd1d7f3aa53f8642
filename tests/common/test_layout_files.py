"""common.files (atomic writes, tolerant readers) and common.layout (the one path owner)."""

from __future__ import annotations

import pytest

from common.files import read_jsonl, read_run_id, read_yaml, write_atomic
from common.layout import RunDir, SweepDir


def test_write_atomic_replaces_whole_or_not_at_all(tmp_path):
    path = tmp_path / "sub" / "config.yaml"
    write_atomic(path, "a: 1\n")
    assert path.read_text() == "a: 1\n"
    with pytest.raises(TypeError):
        write_atomic(path, None)  # fails mid-write: the old file stays, no temp file is left
    assert path.read_text() == "a: 1\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["config.yaml"]


def test_read_jsonl_reports_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n\n{"x": 2}\n{"step": 3}\n{"step": 4, "lo')
    bad = []
    rows = read_jsonl(path, lambda lineno, n, line: bad.append((lineno, n)), require="step")
    assert rows == [{"step": 1}, {"step": 3}]
    assert bad == [(3, 5), (5, 5)]
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 3 is not a JSON object with 'step'"):
        read_jsonl(path, require="step")


def test_read_yaml_and_run_id(tmp_path):
    (tmp_path / "empty.yaml").write_text("")
    assert read_yaml(tmp_path / "empty.yaml") == {}
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ValueError, match=r"list.yaml: expected a mapping of keys, got list"):
        read_yaml(tmp_path / "list.yaml")
    (tmp_path / "id").write_text("abc\n")
    assert read_run_id(tmp_path / "id") == "abc"
    assert read_run_id(tmp_path / "missing") is None and read_run_id(None) is None


def test_layout_paths_and_wildcard_patterns(tmp_path):
    sweep = SweepDir(tmp_path)
    run = sweep.run("r1")
    assert run.checkpoint(40) == tmp_path / "runs/r1/checkpoints/step_40"
    assert run.eval_summary(40, "aime24") == tmp_path / "runs/r1/eval/step_40/aime24.json"
    assert run.state_file == tmp_path / "runs/r1/state/resume.pt"
    assert str(SweepDir("out").run("{run_id}").done) == "out/runs/{run_id}/DONE"
    assert str(sweep.initial.eval_samples(0, "toy")).endswith("initial/eval/step_0/toy.jsonl")
    assert sweep.log("eval", "r1", "step_1_toy") == tmp_path / "logs/eval/r1/step_1_toy.log"
    for step in (10, 2):
        run.eval_dir(step).mkdir(parents=True)
    (run.eval_root / "step_x").mkdir()
    assert [s for s, _ in run.eval_steps()] == [2, 10]
    assert [r.root.name for r in sweep.run_dirs()] == ["r1"]
    assert RunDir(str(run.root)) == run
