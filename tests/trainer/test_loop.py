"""The RL loop end to end on the tiny model: outputs, determinism, resume, faults."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainer.checkpoint import PREEMPTED_EXIT_CODE
from trainer.collection import overlong_penalty
from trainer.loop import train
from trainer.tasks.math import load_math_problems
from trainer.update import NonFiniteError

BENCHMARK_DIR = Path(__file__).resolve().parents[2] / "data" / "benchmarks"

CANONICAL = {
    "step", "reward_mean", "reward_std", "acc_mean", "response_length_mean",
    "response_length_max", "truncated_frac", "entropy", "kl_ref_k1", "kl_ref_k3",
    "kl_behav_k1", "kl_behav_k3", "is_weight_mean", "is_weight_max", "clip_frac_upper",
    "clip_frac_lower", "clip_frac_dual", "pg_loss", "kl_loss", "loss", "groups_kept",
    "groups_dropped", "gen_batches", "grad_norm", "lr", "time_rollout", "time_logprob",
    "time_update", "time_step", "tokens_per_sec", "nonfinite_skips", "ref_updates",
    "rollout_weights_step", "rollout_staleness",
    "rollout_logprob_gap_mean", "rollout_logprob_gap_max", "correction_ratio_mean",
    "correction_ratio_max", "correction_frac_truncated", "correction_frac_masked",
    "correction_ess", "correction_kl_mu_old",
}
TIMING = {"time_rollout", "time_logprob", "time_update", "time_step", "tokens_per_sec"}


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def test_run_writes_everything_and_is_deterministic(make_cfg):
    cfg = make_cfg("a", checkpoint={"eval_steps": [2]},
                   optim={"steps": 3, "epochs": 2, "mini_batch_size": 8})
    out = train(cfg)
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert set(rows[0]) == CANONICAL
    first = rows[0]
    # First mini-batch of the first epoch is on-policy: weights exactly 1, KL to behaviour 0.
    assert first["groups_kept"] == 4 and first["gen_batches"] == 1
    assert 0 <= first["acc_mean"] <= 1 and first["response_length_max"] <= 24
    assert first["kl_ref_k3"] == first["kl_behav_k3"]  # rollout reference: same policy
    assert first["ref_updates"] == 0 and first["nonfinite_skips"] == 0
    for step in (2, 3):
        ck = out / "checkpoints" / f"step_{step}"
        assert (ck / "model.safetensors").exists() and (ck / "tokenizer.json").exists()
    AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "step_3")
    AutoTokenizer.from_pretrained(out / "checkpoints" / "step_3")
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["run_id"] == "a" and saved["tags"] == {"method": "RPG-REINFORCE-URKL"}
    assert (out / "DONE").exists() and not (out / "state" / "resume.pt").exists()
    # Same config and seed: identical metrics (timing excepted).
    again = train(make_cfg("b", optim={"steps": 3, "epochs": 2, "mini_batch_size": 8}))
    assert untimed(metrics(again)) == untimed(rows)
    # A DONE run is not rerun.
    assert train(cfg) == out and len(metrics(out)) == 3


def test_resume_equals_uninterrupted_with_reference_and_mlflow(make_cfg, tmp_path):
    import mlflow

    common = {"optim": {"steps": 4, "epochs": 2, "mini_batch_size": 8},
              "method": {"name": "RPG-REINFORCE-URKL", "reference": {"schedule": "every_k",
                                                                    "k": 3}}}
    full = train(make_cfg("full", **common))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking = {"mlflow_uri": uri, "experiment": "t", "parent_run_id": None}
    parent = mlflow.MlflowClient(uri)
    exp = parent.create_experiment("t")
    parent_id = parent.create_run(exp).info.run_id
    tracking["parent_run_id"] = parent_id
    cut = make_cfg("cut", tracking=tracking, debug={"stop_after_steps": 2}, **common)
    out = train(cut)
    assert not (out / "DONE").exists() and (out / "state" / "resume.pt").exists()
    assert len(metrics(out)) == 2
    run_id = (out / "mlflow_run_id").read_text().strip()
    out = train(make_cfg("cut", tracking=tracking, **common))
    assert (out / "DONE").exists()
    assert untimed(metrics(out)) == untimed(metrics(full))
    assert metrics(full)[-1]["ref_updates"] >= 2  # every_k=3 with 2 optimizer steps per step
    # MLflow: one run (reused on resume), tagged, nested, with every step's metrics.
    client = mlflow.MlflowClient(uri)
    assert (out / "mlflow_run_id").read_text().strip() == run_id
    runs = client.search_runs([exp])
    assert len(runs) == 2  # the parent and one child
    run = client.get_run(run_id)
    assert run.data.tags["method"] == "RPG-REINFORCE-URKL"
    assert run.data.tags["mlflow.parentRunId"] == parent_id
    assert run.info.status == "FINISHED"
    history = client.get_metric_history(run_id, "acc_mean")
    assert sorted(m.step for m in history) == [1, 2, 3, 4]
    assert run.data.params["optim.steps"] == "4"


def test_segments_equal_one_uninterrupted_run(make_cfg):
    """`until_step` (the workflow's train_segment jobs): each segment stops at its step with
    its checkpoint, the state and the segment marker; the segments together write exactly
    the metrics of one uninterrupted run, and a segment already passed is a no-op."""
    common = {"optim": {"steps": 4, "epochs": 2, "mini_batch_size": 8},
              "checkpoint": {"eval_steps": [2]}}
    full = train(make_cfg("whole", **common))
    out = train(make_cfg("parts", **common), until_step=2)
    assert (out / "segments" / "step_2").exists() and (out / "checkpoints" / "step_2").is_dir()
    assert not (out / "DONE").exists() and (out / "state" / "resume.pt").exists()
    assert [m["step"] for m in metrics(out)] == [1, 2]
    train(make_cfg("parts", **common), until_step=2)  # rerun of a finished segment
    assert [m["step"] for m in metrics(out)] == [1, 2]
    train(make_cfg("parts", **common))
    assert (out / "DONE").exists()
    assert untimed(metrics(out)) == untimed(metrics(full))


def test_sigterm_saves_state_and_exits_75_then_resumes(make_cfg, tmp_path):
    cfg = make_cfg("term", optim={"steps": 400})
    path = tmp_path / "term.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    out = Path(cfg.out_dir)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "--config", str(path)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (out / "metrics.jsonl").exists() and len(metrics(out)) >= 2:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == PREEMPTED_EXIT_CODE
    done = len(metrics(out))
    assert 2 <= done < 400 and (out / "state" / "resume.pt").exists()
    assert not (out / "DONE").exists()
    resumed = make_cfg("term", optim={"steps": done + 2})
    train(resumed)
    assert [r["step"] for r in metrics(out)] == list(range(1, done + 3))


def test_a_log_file_shows_the_resume_line_while_the_job_runs(make_cfg, tmp_path):
    """A job's stdout is a file (`> log` under Snakemake and SLURM), and the environment has
    no PYTHONUNBUFFERED: the resume line must still be in the log while the trainer runs,
    not only once it exits (a SLURM drill waits for exactly this line)."""
    train(make_cfg("live", debug={"stop_after_steps": 1}))
    cfg = make_cfg("live", optim={"steps": 400}, debug={"sleep_per_step_s": 1.0})
    path = tmp_path / "live.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    log = tmp_path / "train.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "trainer", "--config", str(path)],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while "[trainer] resuming" not in log.read_text() and proc.poll() is None:
            assert time.monotonic() < deadline, "no resume line in the log after 120 s"
            time.sleep(0.2)
        assert proc.poll() is None, f"the trainer exited ({proc.returncode}):\n{log.read_text()}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def test_nonfinite_updates_are_skipped_then_stop_the_run(make_cfg):
    out = train(make_cfg("nan1", debug={"nonfinite_steps": [2]}))
    rows = metrics(out)
    assert [r["nonfinite_skips"] for r in rows] == [0, 1, 1]
    assert rows[1]["grad_norm"] is None and rows[2]["grad_norm"] is not None
    cfg = make_cfg("nan3", optim={"steps": 5, "max_nonfinite_in_row": 2},
                   checkpoint={"eval_steps": [1]}, debug={"nonfinite_steps": [2, 3]})
    with pytest.raises(NonFiniteError, match=r"step 3: 2 non-finite .*step_1"):
        train(cfg)


@pytest.mark.parametrize("name", ["GRPO", "DAPO", "REINFORCE++"])
def test_baselines_run(make_cfg, name):
    out = train(make_cfg(name.lower(), method={"name": name}, optim={"steps": 2},
                         rollout={"max_gen_batches": 2, "dynamic_sampling": None}))
    for r in metrics(out):
        assert r["groups_kept"] <= 4 and r["gen_batches"] <= 2
        assert r["groups_kept"] + r["groups_dropped"] == 4 * r["gen_batches"]
        if name == "GRPO":  # fixed reference held: KL to it is measured separately
            assert r["kl_ref_k3"] is not None and r["ref_updates"] == 0


def test_overlong_penalty_shape():
    assert overlong_penalty(10, 32, 8, 1.0) == 0.0
    assert overlong_penalty(24, 32, 8, 1.0) == 0.0
    assert overlong_penalty(28, 32, 8, 1.0) == pytest.approx(-0.5)
    assert overlong_penalty(32, 32, 8, 2.0) == pytest.approx(-2.0)


def test_math_task_from_local_files(make_cfg, tmp_path):
    dapo = tmp_path / "dapo.jsonl"
    head = ("Solve the following math problem step by step. The last line of your response "
            "should be of the form Answer: $Answer (without quotes) where $Answer is the "
            "answer to the problem.\n\n")
    tail = '\n\nRemember to put your answer on its own line after "Answer:".'
    dapo.write_text(json.dumps({"prompt": [{"role": "user", "content": head + "What is 2+3?"
                                            + tail}],
                                "reward_model": {"ground_truth": "5"}}) + "\n")
    problems = load_math_problems(str(dapo))
    assert problems == [{"id": "math-000000", "problem": "What is 2+3?", "answer": "5"}]
    aime = BENCHMARK_DIR / "aime24.jsonl"
    assert len(load_math_problems(str(aime), limit=5)) == 5
    with pytest.raises(FileNotFoundError):
        load_math_problems(str(tmp_path / "missing.jsonl"))
    out = train(make_cfg("math", task={"kind": "math", "path": str(aime), "num_prompts": 8},
                         optim={"steps": 1}))
    assert metrics(out)[0]["acc_mean"] == 0.0  # a tiny model does not solve AIME
