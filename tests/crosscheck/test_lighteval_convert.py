"""The cross-check's project-side ends: the benchmark export lighteval reads, the conversion
of a real lighteval 0.13 results file, and the environment build failing with one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.prompts import render
from eval.benchmarks import load_benchmark
from eval.lighteval_convert import build_env, main

# A real lighteval 0.13.0 results file: the tiny default's RPG-UFKL checkpoint at step 100 on
# the 121 toy problems, n=4 (eval/lighteval/run.py, transformers backend on CPU).
RESULTS = Path(__file__).parent / "data" / "lighteval_results_toy.json"


def test_export_is_what_python_m_eval_loads(tmp_path):
    out = tmp_path / "aime24" / "aime24.jsonl"
    file = "data/benchmarks/aime24.jsonl"
    assert main(["export", "--benchmark", "aime24", "--benchmark-file", file, "--limit", "2",
                 "--template", "boxed", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    ours = load_benchmark("aime24", path=file, limit=2).problems
    assert [{k: r[k] for k in ("id", "problem", "answer")} for r in rows] == ours
    assert rows[1]["query"] == render(ours[1]["problem"], "boxed")
    assert "\\boxed{}" in rows[1]["query"]
    # the generated toy benchmark exports every held-out problem, in order
    toy = tmp_path / "toy.jsonl"
    assert main(["export", "--benchmark", "toy", "--template", "dapo", "--out", str(toy)]) == 0
    assert len(toy.read_text().splitlines()) == len(load_benchmark("toy").problems) == 121


def test_convert_real_results_with_the_export(tmp_path, capsys):
    export = tmp_path / "toy.jsonl"
    main(["export", "--benchmark", "toy", "--template", "dapo", "--out", str(export)])
    out = tmp_path / "toy.json"
    assert main(["convert", str(RESULTS), "--out", str(out), "--benchmark", "toy", "--step",
                 "100", "--benchmark-file", str(export), "--template", "dapo",
                 "--checkpoint", "runs/r/checkpoints/step_100"]) == 0
    s = json.loads(out.read_text())
    scorer = s["scorers"]["lighteval_math_verify"]
    # the numbers lighteval printed for this file: avg@n:n=4 0.3223 +- 0.0322
    assert scorer["mean"] == pytest.approx(39 / 121)  # 156 correct of 484 samples
    assert scorer["mean_stderr"] == pytest.approx(0.032199823830126234)
    assert scorer["pass_at_4"] == pytest.approx(0.5619834710743802)
    assert s["num_problems"] == 121 and s["step"] == 100
    assert s["source"]["sha256"] == load_benchmark("toy").source["sha256"]  # same problems
    assert s["sampling"] == {"backend": "hf", "n": 4, "temperature": 1.0, "top_p": 1.0,
                             "max_new_tokens": 48, "seed": 0, "template": "dapo"}
    assert s["checkpoint"] == "runs/r/checkpoints/step_100"


def test_convert_bad_input_is_one_line(tmp_path, capsys):
    junk = tmp_path / "junk.json"
    junk.write_text('{"hello": 1}')
    assert main(["convert", str(junk), "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not a lighteval results file" in err


def test_env_build_that_cannot_install_lighteval_names_the_file(tmp_path, capsys):
    # --no-index: pip looks only at local wheels, where no lighteval lies (no network here)
    req = tmp_path / "lighteval-hf.txt"
    req.write_text("--no-index\nlighteval==0.13.0\n")
    with pytest.raises(RuntimeError, match=f"lighteval is not installable from {req}"):
        build_env(req, tmp_path / "env")
    assert main(["build-env", "--requirements", str(tmp_path / "none.txt"),
                 "--out", str(tmp_path / "env2")]) == 2
    assert "none.txt do not exist" in capsys.readouterr().err
