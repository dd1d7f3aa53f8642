"""The sweep config: what a `config/*.yaml` file may say, as one typed model.

The JSON schema in `workflow/schemas/sweep.schema.json` is generated from `SweepConfig`
(`python -m sweep schema`; a test keeps the two in sync), so Snakemake's schema check and
this model agree on every key. Combination rules (which axis applies to which method) live
in `sweep.expand`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

Scorer = Literal["dapo", "math_verify"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClipAxis(Strict):
    """One clip setting of the grid; `dual_c: null` disables the dual clip."""

    eps_low: float = Field(ge=0, lt=1)
    eps_high: float = Field(ge=0)
    dual_c: float | None = 3.0


class ReferenceAxis(Strict):
    """One reference schedule: rollout (paper), fixed (GRPO), every_k, kl_target."""

    schedule: Literal["rollout", "fixed", "every_k", "kl_target"]
    k: int | None = Field(None, ge=1, description="every_k: refresh every k optimizer steps")
    kappa: float | None = Field(None, gt=0, description="kl_target: refresh above this KL")


class Axes(Strict):
    """Grid axes applied on top of every named method (product of all given lists).

    An axis that does not apply to a method's objective (e.g. `estimator` on an exact RPG
    surrogate) is collapsed for that method with a printed note; an applicable value that
    makes an invalid LossConfig drops that cell with a printed reason.
    """

    divergence: list[Literal["fkl", "rkl", "ufkl", "urkl"]] | None = None
    form: list[Literal["differentiable", "reinforce"]] | None = None
    ratio_level: list[Literal["token", "sequence"]] | None = None
    estimator: list[Literal["k1", "k2", "k3"]] | None = None
    kl_placement: list[Literal["loss", "reward"]] | None = None
    kl_importance_weight: list[Literal["none", "detached", "differentiable"]] | None = None
    clip: list[ClipAxis | None] | None = None
    beta: list[float] | None = None
    reference: list[ReferenceAxis] | None = None

    def given(self) -> dict[str, list]:
        """Axis name -> values, for the axes the sweep sets."""
        return {k: v for k, v in self if v is not None}


class EvalSpec(Strict):
    """When and how checkpoints are evaluated (one job per cell x seed x step x benchmark)."""

    steps: list[int] = Field(min_length=1, description="training steps to evaluate")
    benchmarks: list[str] = Field(min_length=1, description="eval.benchmarks names")
    n: int = Field(32, ge=1, description="samples per problem (Mean@n)")
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(8192, ge=1)
    template: Literal["dapo", "boxed"] = "dapo"
    scorers: list[Scorer] = ["dapo", "math_verify"]
    backend: Literal["hf", "vllm"] = "hf"
    limit: dict[str, int] = Field(default_factory=dict,
                                  description="benchmark -> first N problems (quick looks)")
    files: dict[str, str] = Field(default_factory=dict,
                                  description="benchmark -> local JSONL/parquet instead of hub")
    seed: int = 0
    initial: bool = Field(True, description="also evaluate the initial model (step 0) once "
                          "per benchmark, when it is a local directory: the report's baseline")
    group: Literal["run", "checkpoint"] = Field(
        "run", description="one evaluation job per run (all its checkpoints x benchmarks, one "
        "engine start-up, after training) or per checkpoint (all benchmarks; jobs run in parallel)")

    @field_validator("steps")
    @classmethod
    def _positive_sorted(cls, v: list[int]) -> list[int]:
        if any(s < 1 for s in v):
            raise ValueError(f"eval.steps={v}: steps are >= 1")
        return sorted(set(v))

    @field_validator("benchmarks")
    @classmethod
    def _registered(cls, v: list[str]) -> list[str]:
        from eval.benchmarks import BENCHMARKS  # the one registry of benchmark names

        bad = [b for b in v if b not in BENCHMARKS]
        if bad:
            raise ValueError(f"{bad} not registered; choose from {sorted(BENCHMARKS)} "
                             "(eval/benchmarks.py)")
        return v

    @model_validator(mode="after")
    def _keys_are_benchmarks(self) -> EvalSpec:
        for key in ("limit", "files"):
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

    gpus: int = Field(0, ge=0)
    cpus: int = Field(1, ge=1)
    mem_mb: int = Field(4000, ge=100)
    runtime_min: int = Field(60, ge=1, description="minutes on the first attempt")


class Resources(Strict):
    train: JobResources = JobResources()
    evaluate: JobResources = JobResources()


class TinySpec(Strict):
    """How the workflow builds the tiny model when base.model.path is "tiny"."""

    seed: int = 0
    sft_steps: int | None = Field(None, ge=0, description="warm-start steps (null: default)")
    wrong_fraction: float | None = Field(None, ge=0, le=1,
                                         description="share of noisy SFT targets (null: default)")

    def cli_args(self) -> str:
        flags = {"--seed": self.seed, "--sft-steps": self.sft_steps,
                 "--wrong-fraction": self.wrong_fraction}
        return " ".join(f"{k} {v}" for k, v in flags.items() if v is not None)


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

    @property
    def out_dir(self) -> Path:
        return Path(self.results_dir) / self.name

    @property
    def mlflow_uri(self) -> str:
        return self.mlflow.uri or f"sqlite:///{self.out_dir / 'mlflow.db'}"

    @property
    def experiment(self) -> str:
        return self.mlflow.experiment or self.name


class SweepError(ValueError):
    """A sweep config error; the message names the file and the key."""


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
