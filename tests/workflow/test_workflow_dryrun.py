"""Dry runs of every shipped config (and overlay) with exact job counts, and the lint."""

import re

import pytest
import yaml
from workflow_helpers import REPO, run_snakemake

import trainer.config as trainer_config
from sweep import expand, parse_sweep
from sweep.runconfig import merged, run_config
from trainer.config import RunConfig


def jobs(runs: int, *, tiny: bool = True, eval_in_train: bool = False, seeds_per_job: int = 1,
         **extra: int) -> dict[str, int]:
    """Exact job counts per rule of a sweep of `runs` runs: run_config and (unless the train
    job evaluates, eval.group: train) evaluate_run once a run, train once per
    `seeds_per_job` runs (resources.train.seeds_together: a cell's seeds in one job), the
    sweep-wide rules once (with the tiny model and its step-0 evaluation where the sweep
    builds it), plus `extra` rules."""
    counts = {"tiny_model": 1, "evaluate_initial": 1} if tiny else {}
    per_run = {"run_config": runs, "train": runs // seeds_per_job} | (
        {} if eval_in_train else {"evaluate_run": runs})
    return {**counts, **per_run, "audit": 1, "paper_figures": 1, "report": 1, "all": 1, **extra}


# overlays that train one run per process (vLLM rollouts, the async worker): their
# resources.train.seeds_together is false
ONE_RUN_PER_JOB = {"mismatch", "staleness-async"}


def overlay(name: str, runs: int, **extra: int):
    """The default sweep plus config/ablations/<name>.yaml, and its job counts (the
    default's eval.group: train, so no evaluation jobs, and its 3 seeds in one train job
    per cell)."""
    return (("config/default.yaml", f"config/ablations/{name}.yaml"),
            jobs(runs, eval_in_train=True, seeds_per_job=1 if name in ONE_RUN_PER_JOB else 3,
                 **extra))


# configfiles -> exact job counts per rule (the default has 3 seeds; its overlays inherit them)
SHIPPED = dict([
    (("config/default.yaml",), jobs(18, eval_in_train=True, seeds_per_job=3)),
    (("config/paper.yaml",), jobs(6, tiny=False)),
    (("config/single-gpu.yaml",), jobs(6, tiny=False)),
    (("config/single-gpu-lora.yaml",), jobs(6, tiny=False)),
    (("config/paper.yaml", "config/paper-4k.yaml"), jobs(8, tiny=False)),
    (("config/paper.yaml", "config/paper-2k.yaml"), jobs(6, tiny=False)),
    (("config/paper.yaml", "config/paper-qwen25-7b.yaml"), jobs(12, tiny=False)),
    (("config/real-cpu.yaml",), jobs(6, tiny=False, eval_in_train=True, prepare_model=1,
                                     evaluate_initial=1)),
    overlay("clip", 24),
    overlay("beta", 24),
    overlay("reference", 24),
    overlay("off-policy", 30),
    overlay("crosscheck", 18, lighteval_env=1, crosscheck_benchmark=2, lighteval=36,
            lighteval_summary=36, concordance=1),
    overlay("baselines", 15),
    overlay("frontier", 48),
    overlay("divergence-js", 9),
    overlay("peer-kl", 21),
    overlay("entropy", 12),
    overlay("mask-truncated", 6),
    overlay("schedule-free", 6),
    overlay("mismatch", 108),
    overlay("staleness", 54),
    overlay("staleness-async", 36),
    overlay("lora", 72),
    overlay("axes-grid", 144),
])


def job_counts(stdout: str) -> dict[str, int]:
    table = stdout.split("Job stats:")[1].split("total")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.M)}


def test_every_shipped_config_is_covered():
    shipped = {str(p.relative_to(REPO)) for p in (REPO / "config").rglob("*.yaml")}
    assert shipped == {f for files in SHIPPED for f in files}


@pytest.mark.parametrize("files", list(SHIPPED), ids=lambda f: "+".join(x.split("/")[-1] for x in f))
def test_dry_run_job_counts(files, tmp_path):
    proc = run_snakemake("-n", "-c", "2", "--directory", str(REPO), "--configfile", *files,
                         "--config", f"results_dir={tmp_path}")
    assert job_counts(proc.stdout) == SHIPPED[files]


@pytest.mark.parametrize("files", list(SHIPPED), ids=lambda f: "+".join(x.split("/")[-1] for x in f))
def test_run_configs_carry_the_cells_method(files, monkeypatch):
    """The sweep resolves each cell's method once and writes it into the run config; the
    trainer's RunConfig runs that method and does not resolve it again."""
    data = {}
    for f in files:
        data = merged(data, yaml.safe_load((REPO / f).read_text()))
    sweep = parse_sweep(data, "+".join(files))
    cells, _ = expand(sweep)
    configs = [run_config(sweep, cell) for cell in cells]
    monkeypatch.setattr(trainer_config, "resolve_method", None)  # a second resolution fails
    for cell, cfg in zip(cells, configs):
        assert cfg["method"]["resolved"] == cell.method.model_dump(mode="json"), cell.run_id
        assert RunConfig.model_validate(cfg).resolved_method() == cell.method, cell.run_id


def test_eval_group_checkpoint_makes_one_job_per_checkpoint(tmp_path):
    """eval.group: checkpoint -> one job per (run, step) evaluating every benchmark
    (default sweep: 18 runs x 4 steps = 72, against 18 with the default eval.group: run),
    and the run trains in segments so that each evaluation waits only for its own
    checkpoint's segment (the last one waits for DONE), overlapping the rest of training."""
    overlay = tmp_path / "group.yaml"  # segments are jobs of one run each
    overlay.write_text("eval:\n  group: checkpoint\nresources:\n  train:\n"
                       "    seeds_together: false\n")
    proc = run_snakemake("-n", "-c", "2", "--directory", str(REPO), "--configfile",
                         "config/default.yaml", str(overlay), "--config",
                         f"results_dir={tmp_path}")
    counts = job_counts(proc.stdout)
    assert counts["evaluate"] == 72 and "evaluate_run" not in counts, counts
    assert counts["train_segment"] == 18 * 3 and counts["train"] == 18, counts
    assert counts["evaluate_initial"] == 1, counts
    inputs = {}  # (rule, output's run and step) -> input
    for block in proc.stdout.split("\nrule ")[1:]:
        rule = block.split(":", 1)[0]
        found = re.search(r"input: (.*)\n", block)
        out = re.search(r"output: \S*runs/(\w+_s0)/(?:eval/|segments/)?(step_\d+|DONE)", block)
        if out and out[1] == "grpo_s0":
            inputs[rule, out[2]] = found[1] if found else ""
    run = f"{tmp_path}/default/runs/grpo_s0"
    assert inputs["evaluate", "step_10"] == f"{run}/segments/step_10"
    assert inputs["evaluate", "step_40"] == f"{run}/DONE"
    assert f"{run}/segments/step_10" in inputs["train_segment", "step_20"]
    assert f"{run}/segments/step_30" in inputs["train", "DONE"]


def test_lint_is_clean():
    proc = run_snakemake("--lint")
    assert "Congratulations, your workflow is in a good condition!" in proc.stdout + proc.stderr


def test_bad_sweep_fails_before_any_job_naming_file_and_key(tmp_path):
    bad = yaml.safe_load((REPO / "config/default.yaml").read_text())
    bad["axes"] = {"divergence": ["hellinger"]}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    proc = run_snakemake("-n", "--configfile", str(path), check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert str(path) in out and "axes.divergence" in out and "'fkl'" in out


def test_a_train_job_with_several_gpus_runs_one_process_per_gpu(tmp_path):
    """resources.train.gpus > 1: the train rule launches torchrun (FSDP2) over them, on one
    node with a local rendezvous, on several through srun with SLURM's; one GPU: no torchrun."""
    proc = run_snakemake("-n", "-p", "--configfile", "config/paper.yaml")  # 8 GPUs, 1 node
    assert "python -m trainer.launch --standalone --nproc-per-node 8 -m trainer --config" in proc.stdout
    assert re.search(r"resources: .*gpu=8.*tasks_per_gpu=0", proc.stdout)
    over = tmp_path / "nodes.yaml"
    over.write_text(yaml.safe_dump({"resources": {"train": {"gpus": 8, "nodes": 2}}}))
    multi = run_snakemake("-n", "-p", "--configfile", "config/paper.yaml", str(over))
    assert ("srun --ntasks-per-node=1 --kill-on-bad-exit=1 python -m trainer.launch --slurm "
            "--nproc-per-node 8 -m trainer --config") in multi.stdout
    assert re.search(r"resources: .*gres=gpu:8, nodes=2, tasks=2, tasks_per_gpu=0, mpi=srun",
                     multi.stdout)
    single = run_snakemake("-n", "-p", "--configfile", "config/single-gpu.yaml")
    assert "exec python -m trainer --config" in single.stdout
    assert "trainer.launch" not in single.stdout


def test_building_the_dag_imports_no_model_library(tmp_path):
    """Every snakemake invocation builds the DAG (a dry run, a rerun, each SLURM job step):
    it validates configs against the registries but loads no model, so transformers (about
    4.5 s of import, over half of a dry run while the DAG imported it), peft and vLLM stay
    out of it. What is imported is read from Python's own import log of a real dry run."""
    proc = run_snakemake("-n", "--configfile", "config/default.yaml", "--config",
                         f"results_dir={tmp_path}", env={"PYTHONPROFILEIMPORTTIME": "1"})
    imported = {line.rsplit("|", 1)[1].strip().split(".")[0]
                for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert {"snakemake", "sweep", "torch"} <= imported  # the log is read, and is whole
    assert not imported & {"transformers", "peft", "vllm"}, sorted(imported)
