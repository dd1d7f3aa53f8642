"""A real Snakemake run of a micro sweep: tiny model, two methods, a handful of steps, two
evaluation steps on the toy task and two AIME problems -> tables, plots, report and MLflow
runs read back with mlflow.search_runs. Then: a re-run does nothing, and a training job
killed mid-run resumes on re-run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from workflow_helpers import REPO, STEPS, micro_sweep, reuse_report_extras, smk, snakemake_exe

pytestmark = pytest.mark.slow

def test_sweep_produces_tables_plots_report(finished):
    root, _, _ = finished
    out = root / "results" / "micro"
    report = (out / "report.md").read_text()
    assert "RPG-REINFORCE-URKL" in report and "GRPO" in report
    for scorer in ("dapo", "math_verify"):
        table = (out / "tables" / f"last_best_{scorer}.csv").read_text()
        assert "RPG-REINFORCE-URKL" in table
    assert (out / "plots" / "training.png").stat().st_size > 1000
    assert (out / "plots" / "accuracy_dapo.pdf").stat().st_size > 1000
    assert (out / "audit" / "audit.md").exists() and (out / "paper" / "figure3_rpg_style_clip.png").exists()
    summary = json.loads((out / "runs/rpg-reinforce-urkl_s0/eval/step_4/aime24.json").read_text())
    assert summary["num_problems"] == 2 and summary["sampling"]["n"] == 2
    # the KL to the initial model (eval/kl.py): from the sweep's model dir, into the table
    assert summary["kl_to_initial"]["reference"] == str(out / "model")
    assert summary["kl_to_initial"]["kl_to_initial_k3"] >= 0
    assert "KL Toy Last" in (out / "tables" / "last_best_dapo.md").read_text()
    assert (out / "plots" / "frontier_dapo.png").stat().st_size > 1000
    lines = (out / "runs/grpo_s0/metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == list(range(1, STEPS + 1))


def test_mlflow_parent_children_metrics_and_tags(finished):
    import mlflow

    root, _, _ = finished
    uri = f"sqlite:///{root / 'results' / 'micro' / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["micro"], output_format="pandas")
    parents = runs[runs["tags.kind"] == "sweep"]
    children = runs[runs["tags.method"].notna()]
    assert len(parents) == 1 and len(children) == 2
    assert set(children["tags.mlflow.parentRunId"]) == set(parents["run_id"])
    assert set(children["tags.method"]) == {"RPG-REINFORCE-URKL", "GRPO"}
    assert set(children["tags.divergence"]) == {"urkl", "None"}
    client = mlflow.MlflowClient(uri)
    child = children[children["tags.method"] == "GRPO"]["run_id"].iloc[0]
    assert [m.step for m in client.get_metric_history(child, "reward_mean")] == list(range(1, STEPS + 1))
    evals = client.get_metric_history(child, "eval/toy/dapo/mean")
    assert sorted(m.step for m in evals) == [STEPS // 2, STEPS]
    kl = client.get_metric_history(child, "eval/toy/kl_to_initial_k1")
    assert sorted(m.step for m in kl) == [STEPS // 2, STEPS]


def test_rerun_of_a_finished_sweep_does_nothing(finished):
    root, config, _ = finished
    proc = smk(root, config, "-n")
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_killed_training_job_resumes_on_rerun(finished):
    root, _, _ = finished
    steps = 8
    # a real model path (not "tiny"): reuse the finished sweep's model, no build job; its
    # step-0 evaluation is the finished sweep's business, not the resume's
    config = micro_sweep(root, "killed", ["RPG-REINFORCE-URKL"], steps=steps,
                         model=str(root / "results" / "micro" / "model"), initial_eval=False)
    reuse_report_extras(root / "results" / "micro", root / "results" / "killed")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen(
        [snakemake_exe(), "--snakefile", str(REPO / "Snakefile"), "--directory", str(root),
         "--configfile", str(config), "-c", "1", "--rerun-incomplete"],
        cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    metrics = root / "results/killed/runs/rpg-reinforce-urkl_s0/metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.5)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("training never reached step 3")
    os.killpg(proc.pid, signal.SIGKILL)  # no warning, no chance to save: a hard kill
    proc.wait()
    done_before = len(metrics.read_text().splitlines())
    assert done_before < steps
    assert not (metrics.parent / "DONE").exists()
    smk(root, config, "--unlock")  # a hard kill leaves Snakemake's lock, as on a real node
    rerun = smk(root, config)
    assert (metrics.parent / "DONE").exists()
    log = (root / "results/killed/logs/train/rpg-reinforce-urkl_s0.log").read_text()
    assert "resum" in log.lower()
    steps_logged = [json.loads(x)["step"] for x in metrics.read_text().splitlines()]
    assert sorted(set(steps_logged)) == list(range(1, steps + 1))
    assert rerun.returncode == 0


def grouped_sweep(root, name: str, group: str):
    """A one-run GRPO micro sweep on the finished sweep's model with eval.group `group`,
    reusing its audit and figures."""
    config = micro_sweep(root, name, ["GRPO"], model=str(root / "results" / "micro" / "model"),
                         initial_eval=False)
    reuse_report_extras(root / "results" / "micro", root / "results" / name)
    data = yaml.safe_load(config.read_text())
    data["eval"]["group"] = group
    config.write_text(yaml.safe_dump(data))
    return config


def test_eval_group_checkpoint_trains_in_segments_and_evaluates_each(finished):
    """eval.group: checkpoint, for real: the run trains in two jobs (a segment up to the
    first eval step, then the rest), each checkpoint is evaluated by its own job, and the
    segmented run logs every step exactly once."""
    root, _, _ = finished
    proc = smk(root, grouped_sweep(root, "segmented", "checkpoint"))
    assert proc.returncode == 0
    run = root / "results/segmented/runs/grpo_s0"
    assert (run / "segments" / f"step_{STEPS // 2}").exists() and (run / "DONE").exists()
    steps_logged = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps_logged == list(range(1, STEPS + 1))
    for step in (STEPS // 2, STEPS):
        assert json.loads((run / f"eval/step_{step}/toy.json").read_text())["step"] == step
    logs = root / "results/segmented/logs/train"
    assert (logs / f"grpo_s0.step_{STEPS // 2}.log").exists() and (logs / "grpo_s0.log").exists()


def test_eval_group_train_evaluates_inside_the_training_job(finished):
    """eval.group: train, for real: no evaluation job; the train job (`python -m sweep.job`)
    trains, then evaluates every checkpoint in the same process, into the same files and
    MLflow run an evaluation job would have written."""
    root, _, _ = finished
    proc = smk(root, grouped_sweep(root, "intrain", "train"))
    assert proc.returncode == 0
    assert "evaluate_run" not in proc.stdout + proc.stderr
    run = root / "results/intrain/runs/grpo_s0"
    for step in (STEPS // 2, STEPS):
        for bench in ("toy", "aime24"):
            assert json.loads((run / f"eval/step_{step}/{bench}.json").read_text())["step"] == step
    log = (root / "results/intrain/logs/train/grpo_s0.log").read_text()
    assert "[trainer] run directory" in log and f"toy step={STEPS} mean@2" in log
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root}/results/intrain/mlflow.db")
    run_id = (run / "mlflow_run_id").read_text().strip()
    history = client.get_metric_history(run_id, "eval/toy/dapo/mean")
    assert sorted(m.step for m in history) == [STEPS // 2, STEPS]
    assert (root / "results/intrain/report.md").is_file()


def test_seeds_together_trains_a_cells_seeds_in_one_job(finished):
    """resources.train.seeds_together, for real: one train job for GRPO's two seeds, each
    seed trained, evaluated, tracked in MLflow and logged to its own file, and the report
    built on both."""
    root, _, _ = finished
    config = grouped_sweep(root, "together", "train")
    data = yaml.safe_load(config.read_text())
    data["seeds"] = [0, 1]
    data["resources"] = {"train": {"seeds_together": True}}
    config.write_text(yaml.safe_dump(data))
    proc = smk(root, config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = root / "results/together"
    assert [p.name for p in (out / "benchmarks/train").iterdir()] == ["grpo.tsv"]
    for seed in (0, 1):
        run = out / f"runs/grpo_s{seed}"
        assert (run / "DONE").is_file() and (run / "mlflow_run_id").is_file()
        assert json.loads((run / f"eval/step_{STEPS}/toy.json").read_text())["step"] == STEPS
        log = (out / f"logs/train/grpo_s{seed}.log").read_text()
        assert f"runs/grpo_s{seed}" in log and f"runs/grpo_s{1 - seed}" not in log
    assert "grpo_s1" in (out / "tables/runs.csv").read_text()
