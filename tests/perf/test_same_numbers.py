"""perf/same_numbers.py on constructed run folders: timing keys may differ, nothing else."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "perf" / "same_numbers.py"


def _load():
    spec = importlib.util.spec_from_file_location("same_numbers", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_dir(root: Path, *, loss: float, time_step: float, acc: float) -> Path:
    run = root / "runs" / "dapo_s0"
    (run / "eval" / "step_2").mkdir(parents=True)
    lines = [{"step": s, "loss": loss * s, "time_step": time_step, "tokens_per_sec": 1 / time_step}
             for s in (1, 2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (run / "eval" / "step_2" / "toy.json").write_text(json.dumps({"mean@4": acc}))
    (run / "eval" / "step_2" / "toy.jsonl").write_text(json.dumps({"id": 0, "text": "7"}) + "\n")
    return root


def test_timing_may_differ_numbers_may_not(tmp_path, capsys):
    same_numbers = _load()
    old = _run_dir(tmp_path / "old", loss=0.5, time_step=1.0, acc=0.25)
    faster = _run_dir(tmp_path / "faster", loss=0.5, time_step=0.4, acc=0.25)
    assert same_numbers.main([str(old), str(faster)]) == 0
    assert "ALL IDENTICAL" in capsys.readouterr().out
    drifted = _run_dir(tmp_path / "drifted", loss=0.5 + 1e-12, time_step=1.0, acc=0.25)
    assert same_numbers.main([str(old), str(drifted)]) == 1
    assert "runs/dapo_s0/metrics.jsonl: DIFFERS" in capsys.readouterr().out
    other_eval = _run_dir(tmp_path / "eval", loss=0.5, time_step=1.0, acc=0.5)
    assert same_numbers.main([str(old), str(other_eval)]) == 1
    assert "toy.json: DIFFERS" in capsys.readouterr().out
    (faster / "runs" / "dapo_s0" / "eval" / "step_2" / "toy.jsonl").unlink()
    assert same_numbers.main([str(old), str(faster)]) == 1
    assert "MISSING in new" in capsys.readouterr().out
