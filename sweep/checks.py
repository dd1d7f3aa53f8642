"""Checks of a sweep's inputs that need more than its own schema: the files it names, the
model path and every cell's trainer config. All run at parse time (`snakemake -n` included),
so a bad input stops the sweep before its first job, with the file, the key and the fix.
"""

from __future__ import annotations

from pathlib import Path

from common.grading import SCORERS, strict_scorers
from common.prompts import TEMPLATES
from trainer.config import check_model_path
from trainer.pretrained import MANIFEST, gguf_path, is_prepared

from .expand import Cell
from .runconfig import TINY, model_dir, run_config
from .spec import SweepConfig, SweepError


def check_inputs(sweep: SweepConfig, cells: list[Cell], source: str) -> None:
    """Raise SweepError on the first input that cannot work (paths are relative to the
    directory the workflow runs in)."""
    for bench, path in sweep.eval.files.items():
        if not Path(path).is_file():
            raise SweepError(f"{source}: eval.files.{bench}: {path} does not exist; give an "
                             "existing JSONL/parquet file, or drop the key to load the hub copy")
    model_path = sweep.base.get("model", {}).get("path", TINY)
    made = model_dir(sweep)
    if made is None:  # the user's folder or hub id (the workflow makes the others)
        try:
            check_model_path(str(model_path), probe_hub=False)  # no network at parse time
        except ValueError as exc:
            raise SweepError(f"{source}: base.{exc}") from None
    elif is_prepared(str(model_path)) and not (made / MANIFEST).is_file():
        try:  # the rule prepare_model will need the wheel: say so before any job
            gguf_path(str(model_path))
        except FileNotFoundError as exc:
            raise SweepError(f"{source}: base.{exc}") from None
    configs = [run_config(sweep, cell, source) for cell in cells]
    for cfg in configs[:1]:  # the task section is the base's: the same in every cell
        check_reward(cfg["task"], source)
        check_crosscheck_prompt(sweep, cfg["task"], source)
    check_rollout_gpus(sweep, configs, source)
    check_host_memory(sweep, source)


def check_host_memory(sweep: SweepConfig, source: str) -> None:
    """A GPU job whose host memory (sweep.sizing.host_estimate: vLLM's pinned copy, the
    async worker's, /dev/shm, staleness snapshots) passes resources.train.mem_mb would be
    killed by the kernel or SLURM hours in: refused here. Only for a real model whose shape
    is known (a sizing preset's hub id, or a local folder with config.json, of 100M
    parameters or more: a tiny test model's jobs are all per-process overhead, which the
    sizing only assumes)."""
    from sweep.sizing import ARCHS, REAL_MODEL_PARAMS, host_estimate, host_refusal, model_arch

    model = sweep.base.get("model", {})
    path = str(model.get("path", TINY))
    known = path in ARCHS or (Path(path) / "config.json").is_file()
    if not known or sweep.resources.train.gpus < 1 or model.get("device") == "cpu":
        return
    if model_arch(path).params < REAL_MODEL_PARAMS:
        return
    staleness = max(sweep.axes.staleness or [0])
    host = host_estimate(sweep.base, sweep.resources.train.model_dump(), staleness)
    if (line := host_refusal("base", host)) is not None:
        raise SweepError(f"{source}: {line}")


def check_rollout_gpus(sweep: SweepConfig, configs: list[dict], source: str) -> None:
    """rollout.gpus splits a train job's GPUs (resources.train.gpus, all of them) between
    the async rollout worker and the trainer's ranks: the launch command is one for every
    cell, so the split must be the base's, and leave the trainer at least one GPU."""
    worker = sweep.base.get("rollout", {}).get("gpus", 0)
    for cfg in configs:
        if cfg["rollout"]["gpus"] != worker:
            raise SweepError(f"{source}: cell {cfg['run_id']}: rollout.gpus="
                             f"{cfg['rollout']['gpus']} differs from the base's {worker}; the "
                             "train jobs' launch is one for all cells: set it in base only")
    gpus = sweep.resources.train.gpus
    if worker and worker >= gpus:
        raise SweepError(f"{source}: base.rollout.gpus={worker} leaves the trainer none of "
                         f"resources.train.gpus={gpus} (which counts both): raise "
                         "resources.train.gpus or lower rollout.gpus")
    if worker and sweep.resources.train.nodes > 1:
        raise SweepError(f"{source}: base.rollout.gpus={worker} with resources.train.nodes="
                         f"{sweep.resources.train.nodes}: the rollout worker runs beside rank "
                         "0 on one node; train on one node or set rollout.gpus: 0")


def check_crosscheck_prompt(sweep: SweepConfig, task: dict, source: str) -> None:
    """The lighteval cross-check sends one user message (eval.lighteval_convert), so it
    would drop a template's worked-example turns and the chat template's thinking switch,
    and score another prompt than ours."""
    if not sweep.eval.crosscheck:
        return
    if TEMPLATES.get(task["template"]).examples:
        raise SweepError(f"{source}: eval.crosscheck: lighteval sends one user message, "
                         f"without template {task['template']!r}'s worked-example turns; drop "
                         "eval.crosscheck or train with a template without examples")
    if task["chat"]["enable_thinking"] is not None:
        raise SweepError(f"{source}: eval.crosscheck: lighteval does not pass base.task.chat."
                         f"enable_thinking={task['chat']['enable_thinking']} to the chat "
                         "template; drop eval.crosscheck or leave enable_thinking unset")


def check_reward(task: dict, source: str) -> None:
    """Refuse a lenient training reward (common.grading.Scorer.strict) unless the sweep opts
    in: a policy trained on a grader that reads any expression anywhere learns to restate
    the question (issue 51: 93% of a seed's answers credited that way)."""
    name = task["scorer"]
    if SCORERS.get(name).strict or task.get("allow_gameable_reward"):
        return
    use = TEMPLATES.get(task["template"]).scorer
    raise SweepError(
        f"{source}: base.task.scorer={name!r} is lenient (it credits any expression anywhere "
        f"in the answer, the question restated included, so the policy learns to game it); "
        f"train on {use!r}, the strict scorer of template {task['template']!r} (strict: "
        f"{', '.join(strict_scorers())}), keep {name!r} in eval.scorers as a diagnostic, or "
        "set base.task.allow_gameable_reward: true to accept the risk")
