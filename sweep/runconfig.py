"""From a sweep cell to what each job runs: the trainer's run config and the eval command.

`run_config` deep-merges the sweep's `base` with the cell (method, overrides, seed, ids,
tags, checkpoint steps, tracking) and validates it with the trainer's own `RunConfig`, so a
bad base key fails at DAG build time with the file and key, before any job starts.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from common.layout import RunDir, SweepDir, prepared_model_dir
from trainer.config import RunConfig, parse_run_config
from trainer.pretrained import is_prepared

from .expand import Cell, method_spec, model_settings, rollout_settings
from .spec import SweepConfig, SweepError, merged

TINY = "tiny"  # base.model.path placeholder: the workflow builds the tiny model


def model_dir(sweep: SweepConfig) -> Path | None:
    """The folder the workflow makes for the sweep's model.path: the tiny model's (built or
    copied per sweep), a named pretrained model's (converted once per results directory,
    trainer.pretrained), or None for a folder or hub id of the user's."""
    path = str(sweep.base.get("model", {}).get("path", TINY))
    if path == TINY:
        return SweepDir(sweep.out_dir).model
    if is_prepared(path):
        return prepared_model_dir(sweep.results_dir, path)
    return None


def run_dir(sweep: SweepConfig, run_id: str) -> RunDir:
    return SweepDir(sweep.out_dir).run(run_id)


def run_config(sweep: SweepConfig, cell: Cell, source: str = "<sweep>") -> dict:
    """The resolved, validated trainer config (a plain dict) for one cell; a bad key of the
    sweep's `base` is a one-line SweepError naming `source` and the key."""
    base = dict(sweep.base)
    model = dict(base.get("model", {}))
    made = model_dir(sweep)
    if made is not None:
        model["path"] = str(made)
    # The spec says how the cell was made; `resolved` is what the trainer runs (resolved
    # once, by sweep.expand). `cell.base_method` is always registered (a grid-renamed RPG
    # cell takes the registered name of what it became, which spells divergence and form).
    method = {**method_spec(cell), "resolved": cell.method.model_dump(mode="json")}
    cell_model, cell_optim = model_settings(cell)
    cell_part = {
        "run_id": cell.run_id,
        "label": cell.label,
        "seed": cell.seed,
        "tags": {**cell.tags, "sweep": sweep.name},
        "out_dir": str(run_dir(sweep, cell.run_id).root),
        "model": {**model, **cell_model},
        "method": method,
        "rollout": rollout_settings(cell),
        **({"optim": cell_optim} if cell_optim else {}),
        "checkpoint": {"eval_steps": list(sweep.eval.steps)},
        "tracking": {
            "mlflow_uri": sweep.mlflow_uri if sweep.mlflow.enabled else None,
            "experiment": sweep.experiment,
        },
    }
    resolved = merged(base, cell_part)
    try:
        cfg = parse_run_config(resolved, f"{source}: base (cell {cell.run_id})")
    except ValueError as exc:
        raise SweepError(str(exc)) from None
    return cfg.model_dump(mode="json")


def run_config_yaml(cfg: dict) -> str:
    """A run config as the YAML text the `run_config` rule writes (keys in model order)."""
    return yaml.safe_dump(cfg, sort_keys=False)


def train_command(sweep: SweepConfig) -> str:
    """The trainer's launch command for one train job: `python -m trainer`, or, when the
    sweep gives a train job several GPUs, one process per GPU under torchrun (FSDP2) via
    `trainer.launch` (torchrun with the trainer's exit code 75 on preemption); with
    eval.group: train, `python -m sweep.job` (training, then the evaluation after `--`).
    Under `rollout.gpus: g` (async) the job's last g GPUs are the rollout worker's, which
    rank 0 starts: torchrun gets the others (checks.check_rollout_gpus)."""
    gpus, nodes = sweep.resources.train.gpus, sweep.resources.train.nodes
    # an async rollout worker's GPUs (rollout.gpus) are the job's too, not the trainer's
    gpus -= sweep.base.get("rollout", {}).get("gpus", 0)
    if sweep.eval.group == "train":  # one process (the sweep refuses several GPUs here)
        return "python -m sweep.job"
    if nodes > 1:  # one launcher per node, rendezvous from SLURM's environment
        return (f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 python -m trainer.launch "
                f"--slurm --nproc-per-node {max(gpus, 1)} -m trainer")
    if gpus > 1:
        return f"python -m trainer.launch --standalone --nproc-per-node {gpus} -m trainer"
    return "python -m trainer"


def segment_steps(sweep: SweepConfig) -> list[int]:
    """The steps where a run's training is cut into segments (jobs), so each checkpoint's
    evaluation starts while training goes on: with `eval.group: checkpoint`, every eval
    step before the last step; otherwise none (one train job per run)."""
    if sweep.eval.group != "checkpoint":
        return []
    steps = int(sweep.base.get("optim", {}).get("steps", RunConfig().optim.steps))
    return sorted(s for s in set(sweep.eval.steps) if s < steps)


def train_slurm_resources(sweep: SweepConfig) -> dict:
    """The train rule's GPU/node resources, in the SLURM executor plugin's names.

    One node: `--gpus=N`, one task (torchrun starts a process per GPU). Several nodes: the
    job asks for `gpu:N` per node, one task per node, and is an "mpi" job, so the plugin
    does not wrap the rule's command in `srun -n1`: the command's own `srun` starts one
    launcher per node (`train_command`)."""
    train = sweep.resources.train
    if train.nodes == 1:
        return {"gpu": train.gpus, "tasks_per_gpu": 0} if train.gpus else {}
    return {"gres": f"gpu:{train.gpus}", "nodes": train.nodes, "tasks": train.nodes,
            "tasks_per_gpu": 0, "mpi": "srun"}


def thinking_args(sweep: SweepConfig) -> list[str]:
    """`--enable-thinking` as the runs train (base.task.chat.enable_thinking), for the
    initial model, whose folder holds no run config to read it from; none when unset."""
    thinking = ((sweep.base.get("task") or {}).get("chat") or {}).get("enable_thinking")
    return [] if thinking is None else ["--enable-thinking", str(bool(thinking)).lower()]


def _eval_args(sweep: SweepConfig, checkpoints: list[str], out: str, benches: list[str],
               steps: list[int] = ()) -> list[str]:
    """`python -m eval` arguments: every checkpoint x benchmark with one engine start-up;
    `out` holds {step} when there are several checkpoints; `steps` are theirs (a training
    step before the last eval step takes eval.limit_before_last)."""
    spec = sweep.eval
    args = [
        "--checkpoint", *checkpoints,
        "--benchmark", *benches,
        "--out", out,
        "--n", str(spec.n),
        "--temperature", str(spec.temperature),
        "--top-p", str(spec.top_p),
        "--max-new-tokens", str(spec.max_new_tokens),
        "--template", spec.template,
        "--backend", spec.backend,
        "--seed", str(spec.seed),
        "--scorers", ",".join(spec.scorers),
        "--no-progress",
        *([] if spec.kl else ["--no-kl"]),
        *(["--greedy"] if spec.greedy else []),
        *([] if spec.dtype == "auto" else ["--dtype", spec.dtype]),
        *thinking_args(sweep),
    ]
    for bench in benches:
        if bench in spec.limit:
            args += ["--limit", f"{bench}={spec.limit[bench]}"]
        if bench in spec.files:
            args += ["--benchmark-file", f"{bench}={spec.files[bench]}"]
        for step in steps:
            if bench in spec.limit_before_last and step < spec.steps[-1]:
                args += ["--limit-at", f"{step}:{bench}={spec.limit_before_last[bench]}"]
    return args


def eval_argv(sweep: SweepConfig, run_id: str, steps: list[int], benches: list[str]
              ) -> list[str]:
    """The `python -m eval` arguments for one evaluation job, as a list: checkpoints `steps`
    of run `run_id` on `benches` (eval.group: one step per job, or every step of the run).
    What a Python caller passes to subprocess: never `eval_args` split by hand (its paths
    are shell-quoted, `--out '.../step_{step}'`, and a split without a shell keeps the
    quotes in the path)."""
    rdir = run_dir(sweep, run_id)
    checkpoints = [str(rdir.checkpoint(step)) for step in steps]
    args = _eval_args(sweep, checkpoints, str(rdir.eval_dir("{step}")), benches, steps)
    if sweep.mlflow.enabled:
        args += ["--mlflow-uri", sweep.mlflow_uri, "--mlflow-run-id-file",
                 str(rdir.mlflow_run_id)]
    return args


def eval_args(sweep: SweepConfig, run_id: str, steps: list[int], benches: list[str]) -> str:
    """`eval_argv` as one shell-quoted string, for a Snakemake rule's `shell:` command."""
    return shlex.join(eval_argv(sweep, run_id, steps, benches))


def initial_model(sweep: SweepConfig) -> str | None:
    """The model every run starts from, when it is a local directory (the tiny default or a
    path); None for a hub id, which is not a checkpoint directory to evaluate."""
    path = str(sweep.base.get("model", {}).get("path", TINY))
    made = model_dir(sweep)
    if made is not None:
        return str(made)
    return path if Path(path).is_dir() else None


def initial_eval_args(sweep: SweepConfig, benches: list[str]) -> str | None:
    """The `python -m eval` arguments for the initial model at step 0 on `benches` (None: no
    local model). Its summaries go to results/<sweep>/initial/eval/step_0/, the report's
    baseline row."""
    model = initial_model(sweep)
    if model is None:
        return None
    out = SweepDir(sweep.out_dir).initial.eval_dir(0)
    return shlex.join(_eval_args(sweep, [model], str(out), benches) + ["--step", "0"])


def report_paper_args(sweep: SweepConfig) -> str:
    """`--paper-setting model=...,context=...` when the sweep reproduces a paper table."""
    ps = sweep.paper_setting
    if ps is None:
        return ""
    return shlex.join(["--paper-setting", f"model={ps.model},context={ps.context}"])
