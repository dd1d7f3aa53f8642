"""The sweep config: what a `config/*.yaml` file may say, as one typed model.

The JSON schema in `workflow/schemas/sweep.schema.json` is generated from `SweepConfig`
(`python -m sweep schema`; a test keeps the two in sync), so Snakemake's schema check and
this model agree on every key. Combination rules (which axis applies to which method) live
in `sweep.expand`.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from snakemake.utils import update_config

from algorithms.config import ClipConfig, Divergence, Estimator, Form, ImportanceWeight, RatioLevel
from algorithms.correction import CorrectionMode
from algorithms.reference import REFERENCE_SCHEDULES, get_reference_schedule
from common.generation import ENGINES
from common.grading import SCORERS
from common.layout import SweepDir
from common.prompts import TEMPLATES
from eval.benchmarks import BENCHMARKS  # the one registry of benchmark names
from eval.run import EngineDtype, EvalConfig
from trainer.config import TaskConfig
from trainer.distributed import check_torch
from trainer.tiny import TinyConfig

# The eval job's defaults and names come from evaluation's own config and registries.
_EVAL = EvalConfig.model_fields
_TASK_TEMPLATE = TaskConfig.model_fields["template"].default  # the trainer's default prompt
_CLIP = ClipConfig.model_fields
ScorerName = SCORERS.Name
TemplateName = TEMPLATES.Name
BackendName = ENGINES.Name
BenchmarkName = BENCHMARKS.Name


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClipAxis(Strict):
    """One clip setting of the grid; `dual_c: null` disables the dual clip. An unset dual_c
    is the paper's (`ClipConfig`'s default, its one owner)."""

    eps_low: float = Field(ge=0, lt=1)
    eps_high: float = Field(ge=0)
    dual_c: float | None = _CLIP["dual_c"].default


class ReferenceAxis(Strict):
    """One reference schedule: rollout (paper), fixed (GRPO), every_k, kl_target."""

    schedule: str = Field(json_schema_extra=lambda s: s.update(enum=list(REFERENCE_SCHEDULES)),
                          description="a registered schedule (algorithms.reference)")
    k: int | None = Field(None, ge=1, description="every_k: refresh every k optimizer steps")
    kappa: float | None = Field(None, gt=0, description="kl_target: refresh above this KL")

    @field_validator("schedule")
    @classmethod
    def _registered(cls, v: str) -> str:
        get_reference_schedule(v)  # raises, listing the registered schedules
        return v


class LoraAxis(Strict):
    """One LoRA setting of the grid (the run config's `model.lora`; a `null` entry of the
    axis is full fine-tuning). Unset fields keep trainer.config.LoraSettings' defaults. `lr`
    sets that cell's optim.lr: explicit in the sweep file, never implied by LoRA (the LoRA
    study's best RL learning rate was ~10x full fine-tuning's)."""

    rank: int = Field(ge=1, description="adapter rank")
    alpha: float | None = Field(None, gt=0, description="LoRA alpha (null: the default)")
    lr: float | None = Field(None, gt=0, description="this cell's optim.lr (null: the base's)")


class Axes(Strict):
    """Grid axes applied on top of every named method (product of all given lists).

    An axis that does not apply to a method's objective (e.g. `estimator` on an exact RPG
    surrogate) is collapsed for that method with a printed note; an applicable value that
    makes an invalid LossConfig drops that cell with a printed reason.
    """

    divergence: list[Divergence] | None = None
    form: list[Form] | None = None
    ratio_level: list[RatioLevel] | None = None
    estimator: list[Estimator] | None = None
    kl_placement: list[Literal["loss", "reward"]] | None = None  # "exact" is rpg's alone
    kl_importance_weight: list[ImportanceWeight] | None = None
    clip: list[ClipAxis | None] | None = None
    beta: list[float] | None = None
    entropy_coef: list[float] | None = None  # LossConfig.entropy_coef, any method
    reference: list[ReferenceAxis] | None = None
    correction: list[CorrectionMode] | None = Field(
        None, description="rollout.correction.mode values (algorithms.correction); every method")
    staleness: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, description="rollout.staleness values (trainer.staleness: the sampler k weight "
        "pushes behind), any method, at any world size")
    lora: list[LoraAxis | None] | None = Field(
        None, description="model.lora settings (null = full fine-tuning), any method")

    def given(self) -> dict[str, list]:
        """Axis name -> values, for the axes the sweep sets."""
        return {k: v for k, v in self if v is not None}


class EvalSpec(Strict):
    """When and how checkpoints are evaluated (one job per cell x seed x step x benchmark)."""

    steps: list[int] = Field(min_length=1, description="training steps to evaluate")
    benchmarks: list[BenchmarkName] = Field(min_length=1, description="eval.benchmarks names")
    n: int = Field(_EVAL["n"].default, ge=1, description="samples per problem (Mean@n)")
    temperature: float = Field(_EVAL["temperature"].default, ge=0)
    top_p: float = Field(_EVAL["top_p"].default, gt=0, le=1)
    max_new_tokens: int = Field(_EVAL["max_new_tokens"].default, ge=1)
    template: TemplateName = Field(_TASK_TEMPLATE, description="prompt template; unset: "
                                   "base.task.template, the one the runs train with")
    scorers: list[ScorerName] = list(_EVAL["scorers"].default)
    backend: BackendName = _EVAL["backend"].default
    limit: dict[str, int] = Field(default_factory=dict,
                                  description="benchmark -> first N problems (quick looks)")
    limit_before_last: dict[str, Annotated[int, Field(ge=1)]] = Field(
        default_factory=dict, description="benchmark -> first N problems at the eval steps "
        "before the last: a cheaper curve (the last step and the initial model use "
        "eval.limit, so Last and its baseline see every problem)")
    files: dict[str, str] = Field(default_factory=dict,
                                  description="benchmark -> local JSONL/parquet instead of hub")
    seed: int = _EVAL["seed"].default
    dtype: EngineDtype = Field(
        _EVAL["dtype"].default, description="the evaluation engine's dtype; auto: the "
        "checkpoint's, except that vLLM computes a float32 checkpoint in bfloat16 (its default)")
    kl: bool = Field(_EVAL["kl"].default, description="estimate KL(pi_ckpt || pi_init) on the "
                     "evaluation samples (eval/kl.py): two forward passes of each sample, "
                     "which on CPU cost a real model more than sampling them")
    greedy: bool = Field(False, description="also one greedy answer per problem (temperature "
                         "0) at every evaluation, the initial model's included: a Greedy "
                         "column beside Mean@n, pass@k and maj@k")
    initial: bool = Field(True, description="also evaluate the initial model (step 0) once "
                          "per benchmark, when it is a local directory: the report's baseline")
    crosscheck: list[Literal["lighteval"]] = Field(
        default_factory=list, description="independent evaluators that re-score the "
        "checkpoints (workflow/rules/crosscheck.smk); the report compares them with ours")
    crosscheck_steps: Literal["last", "all"] | list[int] = Field(
        "last", description="checkpoints to cross-check: the last eval step, all, or a list")
    group: Literal["run", "checkpoint", "train"] = Field(
        "run", description="one evaluation job per run (all its checkpoints x benchmarks, one "
        "engine start-up, after training), per checkpoint (all benchmarks; jobs run in "
        "parallel), or none: the training job evaluates its run itself, in the same process "
        "(`python -m sweep.job`: one start-up per run; single-process training only)")

    @field_validator("steps")
    @classmethod
    def _positive_sorted(cls, v: list[int]) -> list[int]:
        if any(s < 1 for s in v):
            raise ValueError(f"eval.steps={v}: steps are >= 1")
        return sorted(set(v))

    @property
    def crosscheck_at(self) -> list[int]:
        """The eval steps the cross-check evaluates (empty without eval.crosscheck)."""
        if not self.crosscheck:
            return []
        if self.crosscheck_steps == "last":
            return self.steps[-1:]
        return self.steps if self.crosscheck_steps == "all" else sorted(set(self.crosscheck_steps))

    @model_validator(mode="after")
    def _keys_are_benchmarks(self) -> EvalSpec:
        if isinstance(self.crosscheck_steps, list):
            extra = sorted(set(self.crosscheck_steps) - set(self.steps))
            if extra:
                raise ValueError(f"eval.crosscheck_steps names {extra}, which eval.steps "
                                 f"{self.steps} does not list; cross-check evaluated steps")
        for bench, n in self.limit_before_last.items():
            if n >= self.limit.get(bench, n + 1):
                raise ValueError(f"eval.limit_before_last.{bench}={n} is not below eval.limit."
                                 f"{bench}={self.limit[bench]}; lower it or drop the key")
        for key in ("limit", "files", "limit_before_last"):
            extra = sorted(set(getattr(self, key)) - set(self.benchmarks))
            if extra:
                raise ValueError(f"eval.{key} names {extra}, which eval.benchmarks "
                                 f"{self.benchmarks} does not list")
        return self


class MlflowSpec(Strict):
    """Tracking: one experiment per sweep, a parent run per invocation, a child per run."""

    enabled: bool = True
    uri: str | None = Field(None, description="default sqlite:///results/<name>/mlflow.db")
    experiment: str | None = Field(None, description="default: the sweep name")

    @field_validator("uri")
    @classmethod
    def _no_password(cls, v: str | None) -> str | None:
        # The URI is copied into every run config and MLflow param: a password in it leaks.
        if v and urlsplit(v).password is not None:
            raise ValueError("the URI holds a password (user:password@host); remove it and set "
                             "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD in the "
                             "environment instead")
        return v


class JobResources(Strict):
    """Per-job resources for a cluster profile; runtime grows linearly with the attempt."""

    gpus: int = Field(0, ge=0, description="GPUs per node (train: one FSDP2 rank each, but the "
                      "last base.rollout.gpus: the async rollout worker's)")
    nodes: int = Field(1, ge=1, description="train: nodes per job (torchrun rendezvous via srun)")
    cpus: int = Field(1, ge=1)
    mem_mb: int = Field(4000, ge=100)
    runtime_min: int = Field(60, ge=1, description="minutes on the first attempt")
    seeds_together: bool = Field(
        False, description="train: one job per cell, its seeds one after another in one "
        "process (one start-up per cell instead of per seed: the imports, the MLflow store "
        "and the grader's pool are a third of a tiny run's cost); runtime_min is per seed")


class Resources(Strict):
    train: JobResources = JobResources()
    evaluate: JobResources = JobResources()

    @model_validator(mode="after")
    def _seeds_together_trains_one_process(self) -> Resources:
        if self.evaluate.seeds_together:
            raise ValueError("resources.evaluate.seeds_together: only training jobs take "
                             "several seeds; set resources.train.seeds_together instead")
        train = self.train
        if train.seeds_together and (train.gpus > 1 or train.nodes > 1):
            raise ValueError(
                f"resources.train.seeds_together runs a cell's seeds in one process, but "
                f"resources.train asks for {train.gpus} GPUs on {train.nodes} node(s) "
                "(torchrun, a process per rank); set seeds_together: false")
        return self


class TinySpec(Strict):
    """How the workflow builds the tiny model when base.model.path is "tiny": overrides of
    `trainer.tiny.TinyConfig` (null: its default), validated by it, passed to
    `python -m trainer tiny` as options."""

    seed: int = 0
    rebuild: bool = Field(False, description="build the tiny model here even when the "
                          "repository's data/tiny-model matches these settings")
    sft_steps: int | None = Field(None, description="warm-start steps (null: default)")
    wrong_fraction: float | None = Field(None, description="share of noisy SFT targets "
                                         "(null: default)")

    @model_validator(mode="after")
    def _valid_for_the_builder(self) -> TinySpec:
        TinyConfig(**self._given())  # the builder's own ranges; raises naming the field
        return self

    def _given(self) -> dict:
        return {k: v for k, v in self if v is not None and k != "rebuild"}

    def builder_config(self) -> TinyConfig:
        """The `TinyConfig` these settings build (compared with the shipped model's)."""
        return TinyConfig(**self._given())

    def cli_args(self) -> str:
        return " ".join(f"--{k.replace('_', '-')} {v}" for k, v in self._given().items())


class PaperSetting(Strict):
    """Which row set of results/reference/reported_results.csv this sweep reproduces."""

    model: str
    context: str


class SweepConfig(Strict):
    """A sweep: base run config + grid + seeds + evaluation + tracking + resources."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="results/<name>/ holds outputs")
    base: dict[str, Any] = Field(
        default_factory=dict,
        description="trainer RunConfig keys shared by every run (model, task, rollout, optim)")
    methods: list[str] = Field(min_length=1, description="algorithms.METHODS names")
    axes: Axes = Axes()
    seeds: list[int] = Field([0], min_length=1)
    eval: EvalSpec
    mlflow: MlflowSpec = MlflowSpec()
    resources: Resources = Resources()
    paper_setting: PaperSetting | None = None
    tiny: TinySpec = TinySpec()
    results_dir: str = Field("results", description="root of all outputs")

    @model_validator(mode="after")
    def _torch_runs_the_train_jobs(self) -> SweepConfig:
        train = self.resources.train
        try:
            check_torch(train.gpus * train.nodes)
        except ValueError as e:
            raise ValueError(f"resources.train: {e}") from None
        return self

    @model_validator(mode="after")
    def _train_group_is_one_process(self) -> SweepConfig:
        train = self.resources.train
        if self.eval.group == "train" and (train.gpus > 1 or train.nodes > 1):
            raise ValueError(
                f"eval.group: train evaluates inside the training process, but "
                f"resources.train asks for {train.gpus} GPUs on {train.nodes} node(s) (one "
                "process each, every one would evaluate); use eval.group: run")
        if train.seeds_together and self.eval.group == "checkpoint":
            raise ValueError(
                "resources.train.seeds_together trains a cell's seeds in one job, but "
                "eval.group: checkpoint trains each run in segments, a job each; use "
                "eval.group: train or run, or set seeds_together: false")
        return self

    @model_validator(mode="before")
    @classmethod
    def _evaluated_with_the_training_prompt(cls, data: Any) -> Any:
        """Checkpoints are evaluated with the prompt template the runs trained with: an
        unset eval.template takes base.task.template, a different one is refused (a model
        trained to answer one prompt and scored on another measures the prompt change)."""
        if not isinstance(data, dict) or not isinstance(data.get("eval"), dict):
            return data
        base = data.get("base") if isinstance(data.get("base"), dict) else {}
        task = base.get("task") if isinstance(base.get("task"), dict) else {}
        trained = task.get("template", _TASK_TEMPLATE)
        given = data["eval"].get("template")
        if given is None:
            return {**data, "eval": {**data["eval"], "template": trained}}
        if given != trained:
            raise ValueError(f"eval.template={given!r} but the runs train with "
                             f"base.task.template={trained!r}: evaluate with the prompt they "
                             "learned (drop eval.template, or set both)")
        return data

    @property
    def out_dir(self) -> Path:
        return Path(self.results_dir) / self.name

    @property
    def mlflow_uri(self) -> str:
        return self.mlflow.uri or f"sqlite:///{SweepDir(self.out_dir).mlflow_db}"

    @property
    def experiment(self) -> str:
        return self.mlflow.experiment or self.name


class SweepError(ValueError):
    """A sweep config error; the message names the file and the key."""


def merged(base: dict, over: dict) -> dict:
    """`over` deep-merged into a copy of `base`, exactly as Snakemake merges config files."""
    out = copy.deepcopy(base)
    update_config(out, over)
    return out


def parse_sweep(data: dict, source: str = "<config>") -> SweepConfig:
    """Validate a loaded sweep dict; errors name `source` and every bad key."""
    try:
        return SweepConfig.model_validate(data)
    except ValidationError as exc:
        lines = [f"{source}: invalid sweep config"]
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"])
            lines.append(f"  {key}: {err['msg'].removeprefix('Value error, ')}")
        raise SweepError("\n".join(lines)) from None


def load_sweep(path: str | Path) -> SweepConfig:
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"{path}: sweep config not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SweepError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SweepError(f"{path}: a sweep config is a mapping of keys, got {type(data).__name__}")
    return parse_sweep(data, str(path))
