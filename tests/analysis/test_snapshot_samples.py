"""tools/snapshot.py --samples: each run's records at its last evaluated step, and the
initial model's, gzipped the same way every time."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("snapshot_tool", REPO / "tools" / "snapshot.py")
snapshot_tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(snapshot_tool)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_last_step_of_each_run_and_the_initial_model(tmp_path):
    sweep = tmp_path / "results" / "real-cpu"
    _write(sweep / "initial" / "eval" / "step_0" / "arithmetic.jsonl", "initial\n")
    _write(sweep / "runs" / "dapo_s0" / "eval" / "step_4" / "arithmetic.jsonl", "early\n")
    _write(sweep / "runs" / "dapo_s0" / "eval" / "step_12" / "arithmetic.jsonl", "last\n")
    _write(sweep / "runs" / "dapo_s1" / "eval" / "step_12" / "toy.jsonl", "other\n")
    dest = tmp_path / "snap"
    written = snapshot_tool.copy_samples(sweep, dest, "arithmetic")
    assert [p.name for p in written] == ["initial.arithmetic.jsonl.gz",
                                         "dapo_s0.arithmetic.jsonl.gz"]
    assert gzip.decompress(written[1].read_bytes()) == b"last\n"  # step 12, not step 4
    first = written[1].read_bytes()
    snapshot_tool.copy_samples(sweep, dest, "arithmetic")
    assert written[1].read_bytes() == first  # mtime 0: the same records, the same bytes
    with pytest.raises(SystemExit, match="no evaluation of 'aime24'"):
        snapshot_tool.copy_samples(sweep, dest, "aime24")
