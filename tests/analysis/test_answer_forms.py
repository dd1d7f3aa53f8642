"""tools/answer_forms.py: the shares it reports, on records shaped like eval/run.py's."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

from analysis.answers import form_table, forms, markdown

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("answer_forms", REPO / "tools" / "answer_forms.py")
answer_forms = importlib.util.module_from_spec(spec)
spec.loader.exec_module(answer_forms)


def record(completion: str, gold: str, lenient: bool, extracted: str, boxed: bool = False,
           finish: str = "stop", tokens: int = 10) -> dict:
    return {"completion": completion, "gold": gold, "finish_reason": finish, "num_tokens": tokens,
            "scorers": {"math_verify": {"correct": lenient, "extracted": extracted},
                        "math_verify_boxed": {"correct": boxed, "extracted": ""}}}


ROWS = [
    record("32 + 48 is 80.", "80", True, "80"),                       # right, and says so
    record("16 is 58 - 36.", "22", True, "58 - 36."),                 # the question restated
    record("so \\boxed{41}", "41", True, "41", boxed=True),            # boxed and right
    record("1. Add 4 and 5", "9", False, "", finish="length", tokens=30),  # cut off
]


def test_the_shares_of_each_answer_form():
    got = forms(ROWS, "math_verify_boxed", "math_verify")
    assert got["lenient"] == 0.75 and got["strict"] == 0.25
    assert got["has_box"] == 0.25
    assert got["last_number_right"] == 0.5  # "80" and "41"; "36" is not 22
    assert got["restated"] == 0.25  # only the restatement
    assert got["cut_off"] == 0.25 and got["tokens"] == pytest.approx(15.0)


def test_the_report_states_the_forms_of_each_runs_last_answers(tmp_path):
    # a run whose last evaluation restates the question, and the initial model: the report's
    # section and CSV hold both, at their own steps
    for run_id, step, rows in (("dapo_s0", 8, ROWS[:2]), ("dapo_s0", 16, ROWS[1:2] * 2)):
        d = tmp_path / "runs" / run_id / "eval" / f"step_{step}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "arithmetic.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    d = tmp_path / "initial" / "eval" / "step_0"
    d.mkdir(parents=True)
    (d / "arithmetic.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    runs = pd.DataFrame({"run_id": ["dapo_s0"], "label": ["DAPO"], "seed": [0],
                         "run_dir": [str(tmp_path / "runs" / "dapo_s0")]})
    table = form_table(runs, tmp_path / "initial", "math_verify_boxed", "math_verify")
    last = table[table["run_id"] == "dapo_s0"].iloc[0]
    assert last.step == 16 and last.restated == 1.0 and last.lenient == 1.0
    assert table[table["run_id"] == "initial"].iloc[0].restated == 0.25
    text = markdown(table, "math_verify_boxed", "math_verify")
    assert "| `dapo_s0` | 16 | 0.0% | 100.0% |" in text and "| Initial model | 0 |" in text


def test_it_reads_a_snapshots_gzipped_samples_and_prints_one_line_each(tmp_path, capsys):
    path = tmp_path / "dapo_s0.arithmetic.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in ROWS)
    assert answer_forms.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and out[2].startswith("dapo_s0.arithmetic.jsonl.gz")
    assert "75.0%" in out[2] and "25.0%" in out[2]
    assert answer_forms.main([str(tmp_path / "none")]) == 2
