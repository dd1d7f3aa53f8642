"""End to end: `python -m eval` on the tiny checkpoint, MLflow mirror, errors, lighteval."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from eval.__main__ import main
from eval.run import EvalConfig

FIXTURE = Path(__file__).parent / "data" / "lighteval_results_tiny.json"
SCORER_KEYS = {
    "mean", "mean_stderr", "mean_ci95_low", "mean_ci95_high", "pass_at_1", "pass_at_2",
    "pass_at_4", "maj_at_1", "maj_at_2", "maj_at_4", "extract_fail_rate", "timeout_rate",
    "error_rate",
}  # fmt: skip


def _args(ckpt, bench_file, out, *extra):
    return [
        "--checkpoint", str(ckpt), "--benchmark", "aime24", "--benchmark-file", str(bench_file),
        "--n", "4", "--temperature", "1.0", "--top-p", "1.0", "--max-new-tokens", "12",
        "--template", "dapo", "--backend", "hf", "--limit", "3", "--batch-size", "8",
        "--out", str(out), "--no-progress", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def first_run(tiny_checkpoint, benchmark_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "step_7"
    assert main(_args(tiny_checkpoint, benchmark_dir / "aime24.jsonl", out)) == 0
    return out


def test_end_to_end_files_and_schema(first_run, tiny_checkpoint):
    summary = json.loads((first_run / "aime24.json").read_text())
    assert summary["benchmark"] == "aime24" and summary["step"] == 7  # from .../step_7
    assert summary["checkpoint"] == str(tiny_checkpoint)
    assert len(summary["model_sha256"]) == 64
    assert summary["source"]["kind"] == "local" and summary["num_problems"] == 3
    assert summary["sampling"] == {
        "backend": "hf", "n": 4, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 12,
        "seed": 0, "template": "dapo", "enable_thinking": None,
    }  # fmt: skip
    assert set(summary["scorers"]) == {"dapo", "math_verify"}
    for scores in summary["scorers"].values():
        assert set(scores) == SCORER_KEYS

    records = [json.loads(x) for x in (first_run / "aime24.jsonl").read_text().splitlines()]
    assert len(records) == 12
    assert [(r["problem_id"], r["sample_index"]) for r in records[:5]] == [
        ("aime24-00", 0), ("aime24-00", 1), ("aime24-00", 2), ("aime24-00", 3), ("aime24-01", 0),
    ]  # fmt: skip
    for r in records:
        assert 1 <= r["num_tokens"] <= 12 and r["finish_reason"] in ("stop", "length")
        assert set(r["scorers"]) == {"dapo", "math_verify"}
        assert set(r["scorers"]["dapo"]) == {"extracted", "correct", "status"}
    # the summary agrees with the per-sample file
    trunc = sum(r["finish_reason"] == "length" for r in records) / 12
    assert summary["truncation_rate"] == pytest.approx(trunc)
    for name in ("dapo", "math_verify"):
        mean = sum(r["scorers"][name]["correct"] for r in records) / 12
        fails = sum(r["scorers"][name]["status"] == "no_answer" for r in records) / 12
        assert summary["scorers"][name]["mean"] == pytest.approx(mean)
        assert summary["scorers"][name]["extract_fail_rate"] == pytest.approx(fails)
    assert not list(first_run.glob(".*.tmp"))  # atomic writes leave no temp files


def test_same_inputs_give_identical_files(first_run, tiny_checkpoint, benchmark_dir, tmp_path):
    out = tmp_path / "step_7"
    assert main(_args(tiny_checkpoint, benchmark_dir / "aime24.jsonl", out)) == 0
    for name in ("aime24.json", "aime24.jsonl"):
        assert (out / name).read_bytes() == (first_run / name).read_bytes()


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory):
    """A real MLflow sqlite store (creating its schema costs a few seconds, so shared)."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    return uri, client, client.create_experiment("eval-test")


def test_mlflow_mirror(mlflow_store, tiny_checkpoint, benchmark_dir, tmp_path):
    uri, client, experiment = mlflow_store
    run_id = client.create_run(experiment).info.run_id
    args = _args(tiny_checkpoint, benchmark_dir / "aime24.jsonl", tmp_path / "o", "--limit", "2")
    args += ["--step", "40", "--scorers", "dapo", "--mlflow-uri", uri, "--mlflow-run-id", run_id]
    assert main(args) == 0
    summary = json.loads((tmp_path / "o" / "aime24.json").read_text())
    assert set(summary["scorers"]) == {"dapo"}
    hist = client.get_metric_history(run_id, "eval/aime24/dapo/extract_fail_rate")
    assert [(m.step, m.value) for m in hist] == [
        (40, summary["scorers"]["dapo"]["extract_fail_rate"])
    ]
    logged = client.get_run(run_id).data.metrics
    assert "eval/aime24/truncation_rate" in logged and "eval/aime24/dapo/pass_at_4" in logged


def test_mlflow_failure_only_warns(mlflow_store, tiny_checkpoint, benchmark_dir, tmp_path):
    uri = mlflow_store[0]
    args = _args(tiny_checkpoint, benchmark_dir / "aime24.jsonl", tmp_path / "o", "--limit", "1")
    args += ["--scorers", "dapo", "--mlflow-uri", uri, "--mlflow-run-id", "no-such-run"]
    with pytest.warns(UserWarning, match="MLflow logging"):
        assert main(args) == 0
    assert (tmp_path / "o" / "aime24.json").is_file()


def test_missing_run_id_evaluates_without_mlflow_and_notes_it(tiny_checkpoint, benchmark_dir,
                                                              tmp_path):
    """Training could not reach MLflow, so it wrote no run id: evaluation still runs (it used to
    fail with rc 2 on every rerun) and notes the run as pending for a later sync."""
    run_dir = tmp_path / "runs" / "r"
    out = run_dir / "eval" / "step_1"
    args = _args(tiny_checkpoint, benchmark_dir / "aime24.jsonl", out, "--limit", "1")
    args += ["--scorers", "dapo", "--mlflow-uri", f"sqlite:///{tmp_path / 'm.db'}",
             "--mlflow-run-id-file", str(run_dir / "mlflow_run_id")]
    with pytest.warns(UserWarning, match="no MLflow run id"):
        assert main(args) == 0
    assert (out / "aime24.json").is_file()
    assert "no MLflow run id" in (run_dir / "mlflow_pending").read_text()


def test_unreachable_server_fails_fast_and_notes_pending(tiny_checkpoint, benchmark_dir,
                                                         tmp_path):
    """An unreachable tracking server costs one health probe, not MLflow's ~4 min of retries."""
    import socket
    import time

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_dir = tmp_path / "runs" / "r"
    (run_dir).mkdir(parents=True)
    (run_dir / "mlflow_run_id").write_text("abc\n")
    args = _args(tiny_checkpoint, benchmark_dir / "aime24.jsonl", run_dir / "eval" / "step_1",
                 "--limit", "1")
    args += ["--scorers", "dapo", "--mlflow-uri", f"http://127.0.0.1:{port}",
             "--mlflow-run-id-file", str(run_dir / "mlflow_run_id")]
    t0 = time.monotonic()
    with pytest.warns(UserWarning, match="does not answer"):
        assert main(args) == 0
    assert time.monotonic() - t0 < 60
    assert "MLflow logging failed" in (run_dir / "mlflow_pending").read_text()


def test_bad_input_fails_before_generation(tiny_checkpoint, benchmark_dir, tmp_path, capsys):
    bench = benchmark_dir / "aime24.jsonl"
    no_tok = tmp_path / "no_tok"
    no_tok.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(tiny_checkpoint / f, no_tok / f)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"problem": "1+1", "answer": "2"}\nnot json\n')
    cases = [
        (_args(no_tok, bench, tmp_path / "o1"), "has no tokenizer"),
        (_args(tiny_checkpoint, broken, tmp_path / "o2"), "broken.jsonl: line 2 is not a JSON object"),
        (_args(tiny_checkpoint, tmp_path / "nope.jsonl", tmp_path / "o3"), "does not exist"),
        (_args(tiny_checkpoint, bench, tmp_path / "o4", "--ks", "1,8"), "need 1 <= k <= n"),
        (_args(tiny_checkpoint, bench, tmp_path / "o5", "--n", "0"), "n: Input should be"),
        (_args(tiny_checkpoint, bench, tmp_path / "o6", "--scorers", "dapo,regex"), "scorers"),
        (_args(tiny_checkpoint, bench, tmp_path / "o7", "--mlflow-run-id", "x"), "--mlflow-uri"),
        (_args(tiny_checkpoint, bench, tmp_path / "o8", "--dtype", "fp32"),
         "dtype: Input should be 'auto', 'float32'"),
    ]
    for args, message in cases:
        assert main(args) == 2
        assert message in capsys.readouterr().err
        assert not Path(args[args.index("--out") + 1]).exists()  # nothing was generated


def test_config_rejects_unknown_keys():
    with pytest.raises(ValidationError, match="max_tokens"):
        EvalConfig(checkpoint="c", benchmark="aime24", out="o", max_tokens=16)
    with pytest.raises(ValidationError, match="template='cot' is not registered"):
        EvalConfig(checkpoint="c", benchmark="aime24", out="o", template="cot")


def test_convert_lighteval_real_results_file(tmp_path, capsys):
    # The fixture is a real lighteval 0.13 results file from the tiny model (all zeros), so
    # distinct values are written into a copy to pin which metric lands where.
    results = json.loads(FIXTURE.read_text())
    task = results["results"]["aime24_local|0"]
    for i, key in enumerate(sorted(task)):
        task[key] = round(0.1 + 0.01 * i, 4)
    src = tmp_path / "results.json"
    src.write_text(json.dumps(results))
    out = tmp_path / "lighteval_aime24.json"
    assert main(["convert-lighteval", str(src), "--out", str(out), "--benchmark", "aime24"]) == 0
    s = json.loads(out.read_text())
    scorer = s["scorers"]["lighteval_math_verify"]
    assert scorer["mean"] == task["avg@n:n=4"]
    assert scorer["mean_stderr"] == task["avg@n:n=4_stderr"]
    for k in (1, 2, 4):
        assert scorer[f"pass_at_{k}"] == task[f"pass@k:k={k}&n=4"]
        assert s["lighteval_other"][f"pass@k:k={k}&n=4_stderr"] == task[f"pass@k:k={k}&n=4_stderr"]
    assert scorer["extract_fail_rate"] is None and scorer["mean_ci95_low"] is None
    assert s["benchmark"] == "aime24" and s["sampling"]["n"] == 4 and s["step"] is None
    assert s["sampling"]["max_new_tokens"] == 16 and s["sampling"]["temperature"] == 1.0
    assert s["source"]["kind"] == "local"
    # the unmodified fixture converts too; amc23 is the other task in it
    assert main(["convert-lighteval", str(FIXTURE), "--out", str(out), "--benchmark", "amc23"]) == 0
    assert json.loads(out.read_text())["benchmark"] == "amc23"
    # several tasks in one file: the benchmark must be chosen
    capsys.readouterr()
    assert main(["convert-lighteval", str(FIXTURE), "--out", str(tmp_path / "x.json")]) == 2
    assert "choose one with --benchmark" in capsys.readouterr().err
    junk = tmp_path / "junk.json"
    junk.write_text('{"hello": 1}')
    assert main(["convert-lighteval", str(junk), "--out", str(tmp_path / "y.json")]) == 2
    assert "not a lighteval results file" in capsys.readouterr().err


# ---- several checkpoints x benchmarks, one engine start-up ----


def _perturbed(src: Path, dst: Path, scale: float) -> Path:
    """A copy of `src` with every weight moved (another "step" of the same run)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src)
    gen = torch.Generator().manual_seed(int(scale * 100))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    model.save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    return dst


def test_many_checkpoints_one_process_equal_one_process_each(tiny_checkpoint, benchmark_dir,
                                                             tmp_path):
    """Two checkpoints x two benchmarks in one process (one engine, weights swapped) write
    byte-identical files to a separate `python -m eval` process per checkpoint."""
    import subprocess
    import sys

    run = tmp_path / "run" / "checkpoints"
    ckpts = [_perturbed(tiny_checkpoint, run / "step_3", 0.02),
             _perturbed(tiny_checkpoint, run / "step_6", 0.05)]
    common = ["--benchmark", "toy", "aime24", "--benchmark-file",
              f"aime24={benchmark_dir / 'aime24.jsonl'}", "--limit", "toy=6", "--limit",
              "aime24=2", "--n", "3", "--max-new-tokens", "10", "--seed", "5",
              "--batch-size", "4", "--device", "cpu", "--no-progress"]
    together = tmp_path / "together" / "step_{step}"
    assert main(["--checkpoint", *map(str, ckpts), "--out", str(together), *common]) == 0
    for ckpt in ckpts:
        alone = tmp_path / "alone" / ckpt.name
        proc = subprocess.run([sys.executable, "-m", "eval", "--checkpoint", str(ckpt),
                               "--out", str(alone), *common], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    files = sorted(p.relative_to(tmp_path / "alone") for p in (tmp_path / "alone").rglob("*.json*"))
    assert len(files) == 8  # 2 steps x 2 benchmarks x (summary + samples)
    for rel in files:
        assert (tmp_path / "together" / rel).read_bytes() == (tmp_path / "alone" / rel).read_bytes()
    steps = {json.loads((tmp_path / "together" / f"step_{s}" / "toy.json").read_text())["step"]
             for s in (3, 6)}
    assert steps == {3, 6}
    # The checkpoints differ, so identical files are not an accident of equal weights.
    texts = [(tmp_path / "together" / f"step_{s}" / "toy.jsonl").read_text() for s in (3, 6)]
    assert texts[0] != texts[1]


def test_many_checkpoints_need_a_step_placeholder_and_one_architecture(tiny_checkpoint,
                                                                       tmp_path, capsys):
    base = ["--benchmark", "toy", "--limit", "1", "--n", "1", "--max-new-tokens", "2",
            "--device", "cpu", "--no-progress"]
    b = _perturbed(tiny_checkpoint, tmp_path / "step_2", 0.01)
    assert main(["--checkpoint", str(tiny_checkpoint), str(b), "--out", str(tmp_path / "o"),
                 *base]) == 2
    assert "must hold {step}" in capsys.readouterr().err
    assert main(["--checkpoint", str(b), "--benchmark", "aime24", "--benchmark-file", "x.jsonl",
                 "--out", str(tmp_path / "o"), *base]) == 2
    assert "BENCH=PATH" in capsys.readouterr().err
    # Another architecture cannot be swapped into the running engine.
    wide = tmp_path / "wide" / "step_4"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = AutoModelForCausalLM.from_pretrained(tiny_checkpoint).config
    cfg.num_hidden_layers = 1
    AutoModelForCausalLM.from_config(cfg).save_pretrained(wide)
    AutoTokenizer.from_pretrained(tiny_checkpoint).save_pretrained(wide)
    assert main(["--checkpoint", str(b), str(wide), "--out", str(tmp_path / "s_{step}"),
                 *base]) == 2
    assert "num_hidden_layers" in capsys.readouterr().err
    assert not (tmp_path / "s_2").exists()  # refused before any generation


def test_evaluation_uses_the_template_the_run_trained_with(tmp_path):
    """A checkpoint the trainer saved carries its run config: evaluation reads its
    task.template, and refuses another one; a checkpoint of no run of ours takes the one
    asked for (dapo by default)."""
    import yaml

    from eval.run import trained_template

    ckpt = tmp_path / "step_4"
    ckpt.mkdir()
    assert trained_template(ckpt, None) == "dapo" and trained_template(ckpt, "boxed") == "boxed"
    (ckpt / "run_config.yaml").write_text(yaml.safe_dump({"task": {"template": "boxed"}}))
    assert trained_template(ckpt, None) == "boxed" == trained_template(ckpt, "boxed")
    with pytest.raises(ValueError, match=r"--template dapo: .*step_4 was trained with template "
                                         r"'boxed' \(its run_config.yaml\)"):
        trained_template(ckpt, "dapo")
    (ckpt / "run_config.yaml").write_text(yaml.safe_dump({"task": {"kind": "toy"}}))
    assert trained_template(ckpt, None) == "dapo"  # the trainer's default prompt


def test_greedy_adds_the_greedy_answers_accuracy_and_leaves_the_sampled_pass_alone(tmp_path):
    """--greedy: each scorer's summary gets `greedy`, the accuracy an n = 1, temperature-0
    evaluation of the same problems reports as its mean; every sampled number and record is
    what the evaluation without --greedy writes."""
    model = Path(__file__).resolve().parents[2] / "data" / "tiny-model"

    def run(name, *extra):
        out = tmp_path / name
        assert main(["--checkpoint", str(model), "--step", "0", "--benchmark", "toy",
                     "--limit", "40", "--max-new-tokens", "24", "--template", "dapo",
                     "--backend", "hf", "--out", str(out), "--no-progress", "--no-kl",
                     *extra]) == 0
        return json.loads((out / "toy.json").read_text()), (out / "toy.jsonl").read_text()

    with_greedy, records = run("greedy", "--n", "2", "--temperature", "1.0", "--greedy")
    sampled, sampled_records = run("sampled", "--n", "2", "--temperature", "1.0")
    greedy_only, _ = run("greedy_only", "--n", "1", "--temperature", "0")
    assert records == sampled_records
    for scorer, block in with_greedy["scorers"].items():
        assert block.pop("greedy") == greedy_only["scorers"][scorer]["mean"]
        assert block == sampled["scorers"][scorer]
    assert greedy_only["scorers"]["math_verify"]["mean"] > 0  # a test of something
