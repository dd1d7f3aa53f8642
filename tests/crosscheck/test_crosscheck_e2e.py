"""One real cross-check of a tiny checkpoint: lighteval in its own environment against
`python -m eval`, through export, eval/lighteval/run.py, conversion and the concordance.

Opt-in (`pytest -m lighteval`): building lighteval's environment needs a package index and
takes minutes (docs: evaluation, cross-check). RPG_LIGHTEVAL_ENV=<venv> reuses a built one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.concordance import compare
from eval.lighteval_convert import build_env, convert_file, export_benchmark

REPO = Path(__file__).resolve().parents[2]
SAMPLING = ["--n", "4", "--temperature", "1.0", "--top-p", "1.0", "--max-new-tokens", "48"]


@pytest.fixture(scope="module")
def lighteval_python(tmp_path_factory) -> Path:
    given = os.environ.get("RPG_LIGHTEVAL_ENV")
    env = Path(given) if given else tmp_path_factory.mktemp("env") / "lighteval-hf"
    if not given:
        build_env(REPO / "workflow" / "envs" / "lighteval-hf.txt", env)
    return env / "bin" / "python"


@pytest.mark.slow
@pytest.mark.lighteval
def test_lighteval_agrees_with_us_on_a_tiny_checkpoint(lighteval_python, tmp_path):
    ckpt = tmp_path / "model"
    subprocess.run([sys.executable, "-m", "trainer", "tiny", "--out", str(ckpt),
                    "--sft-steps", "300"], check=True, cwd=REPO)
    ours_dir = tmp_path / "ours" / "step_1"
    subprocess.run([sys.executable, "-m", "eval", "--checkpoint", str(ckpt), "--benchmark", "toy",
                    "--limit", "40", "--out", str(ours_dir), "--step", "1", "--no-progress",
                    *SAMPLING], check=True, cwd=REPO)
    bench = tmp_path / "bench" / "toy"
    export_benchmark("toy", bench / "toy.jsonl", "dapo", limit=40)
    raw = tmp_path / "le" / "toy.results.json"
    subprocess.run([str(lighteval_python), str(REPO / "eval" / "lighteval" / "run.py"),
                    "--checkpoint", str(ckpt), "--benchmark", "toy", "--benchmark-dir",
                    str(bench), "--out", str(raw), *SAMPLING], check=True)
    theirs = convert_file(raw, tmp_path / "le" / "toy.json", "toy", 1, bench / "toy.jsonl",
                          "dapo", str(ckpt))
    ours = json.loads((ours_dir / "toy.json").read_text())
    row = compare(ours, theirs, "tiny", "tiny")
    assert row.same_problems and row.problems == 40
    assert ours["scorers"]["math_verify"]["mean"] > 0.05  # a checkpoint that solves some
    # 99.9% noise band (z = 3.29) so that a correct setup fails 1 run in 1000, while a setup
    # that cuts the prompt (see run.py's model_args) lands far outside it
    assert abs(row.diff) <= row.noise * 3.29 / 1.96, row
