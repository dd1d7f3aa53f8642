"""Evaluation: (checkpoint, benchmark) -> per-sample JSONL + summary JSON, for many
checkpoints and benchmarks with one engine start-up.

    python -m eval --checkpoint results/x/runs/r/checkpoints/step_40 --benchmark aime24 \\
        --n 32 --max-new-tokens 8192 --backend vllm --out results/x/runs/r/eval/step_40

Order of work: validate every (checkpoint, benchmark) config, load every benchmark, check
every checkpoint (so a bad file, a missing tokenizer or n < k fails before any weights
load); then start the engine once on the first checkpoint and, checkpoint by checkpoint,
swap its weights in (`Engine.load_checkpoint`) and for each benchmark sample, grade with
each chosen scorer, estimate the KL to the initial model on the same samples (eval/kl.py),
summarize, write both files atomically, optionally mirror the summary into MLflow. Same inputs and seed give byte-identical files (no timestamps), whether a
checkpoint is evaluated alone or after others in the same process.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from tqdm.auto import tqdm

from common import grading, tracking
from common.files import write_atomic
from common.generation import ENGINES, Engine, EngineOptions, Sample, start_engine
from common.generation.base import check_checkpoint, check_same_architecture
from common.generation.hf import HFEngine
from common.prompts import TEMPLATES, build_prompt, check_examples_unseen, encode_prompts
from eval import kl, metrics
from eval.benchmarks import BENCHMARKS, Benchmark, load_benchmark

EngineDtype = Literal["auto", "float32", "bfloat16", "float16"]


class EvalConfig(BaseModel):
    """Everything one evaluation depends on; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    checkpoint: str  # HF checkpoint directory (weights + tokenizer)
    benchmark: BENCHMARKS.Name  # one of eval.benchmarks.BENCHMARKS
    out: str  # output directory; gets <benchmark>.jsonl and <benchmark>.json
    n: int = Field(32, ge=1)  # samples per problem (Mean@n)
    temperature: float = Field(1.0, ge=0.0)  # 0 = greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(8192, ge=1)  # always explicit (vLLM defaults to 16)
    # prompt template in common.prompts.TEMPLATES; None: the one the checkpoint's run trained
    # with (its run_config.yaml task.template), else DEFAULT_TEMPLATE (`trained_template`)
    template: TEMPLATES.Name | None = None
    # the chat template's thinking switch (task.chat.enable_thinking); None: the one the
    # checkpoint's run trained with, else the chat template's default (`trained_thinking`)
    enable_thinking: bool | None = None
    backend: ENGINES.Name = "hf"  # generation engine in common.generation.ENGINES
    seed: int = 0  # sampling seed and bootstrap seed
    step: int | None = None  # training step recorded in the summary (null: not a run)
    benchmark_file: str | None = None  # local JSONL/parquet instead of the hub source
    scorers: tuple[grading.SCORERS.Name, ...] = Field(grading.DEFAULT_SCORERS, min_length=1)
    ks: tuple[int, ...] | None = None  # pass@k / maj@k values; default 1, 2, 4, ..., n
    batch_size: int = Field(64, ge=1)  # hf backend: rows per generate call
    limit: int | None = Field(None, ge=1)  # first `limit` problems only (quick looks)
    timeout_s: float = Field(grading.DEFAULT_TIMEOUT_S, gt=0)  # math_verify per-item limit
    device: str = "auto"  # hf backend
    dtype: EngineDtype = "auto"  # auto: the checkpoint's (vLLM: bf16 for a float32 one)
    mlflow_uri: str | None = None
    mlflow_run_id: str | None = None  # null with a URI: no MLflow, noted in mlflow_pending_dir
    mlflow_pending_dir: str | None = None  # run dir where a failed mirror is noted for a sync
    progress: bool = True
    kl: bool = True  # KL to the initial model named in the checkpoint's run config (eval/kl.py)
    greedy: bool = False  # also one greedy answer per problem (temperature 0): a Greedy column

    @field_validator("scorers")
    @classmethod
    def _unique_scorers(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(v))

    @model_validator(mode="after")
    def _ks_within_n(self) -> EvalConfig:
        bad = [k for k in self.ks or () if not 1 <= k <= self.n]
        if bad:
            raise ValueError(f"ks={list(bad)}: pass@k and maj@k need 1 <= k <= n (n={self.n})")
        return self


def infer_step(checkpoint: str) -> int | None:
    """The N of a ".../step_<N>" checkpoint directory, else None."""
    m = re.fullmatch(r"step_(\d+)", Path(checkpoint).name)
    return int(m.group(1)) if m else None


@functools.cache
def model_sha256(path: Path) -> str:
    """sha256 over the weight files (name + content), in name order. Cost: reads every
    weight byte once (~seconds per GB)."""
    files = sorted(
        p for p in path.iterdir() if p.suffix in (".safetensors", ".bin", ".pt") and p.is_file()
    )
    if not files:
        raise ValueError(f"{path} holds no weight files (*.safetensors, *.bin)")
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode())
        with p.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                h.update(chunk)
    return h.hexdigest()


def grade_samples(
    bench: Benchmark, samples: list[list[Sample]], cfg: EvalConfig
) -> dict[str, list[list[grading.GradeResult]]]:
    """Grades per scorer, shaped like `samples` (problems x n)."""
    completions = [s.text for per in samples for s in per]
    golds = [p["answer"] for p, per in zip(bench.problems, samples) for _ in per]
    n = cfg.n
    out = {}
    for scorer in tqdm(cfg.scorers, desc="grade", disable=not cfg.progress, unit="scorer"):
        flat = grading.grade_many(completions, golds, scorer, timeout_s=cfg.timeout_s)
        out[scorer] = [flat[i * n : (i + 1) * n] for i in range(len(samples))]
    return out


def sample_records(
    bench: Benchmark, samples: list[list[Sample]], grades: dict[str, list[list]]
) -> list[dict]:
    """One JSON-able record per (problem, sample)."""
    records = []
    for i, (problem, per) in enumerate(zip(bench.problems, samples)):
        for j, s in enumerate(per):
            scores = {
                name: {
                    "extracted": g[i][j].extracted,
                    "correct": g[i][j].correct,
                    "status": g[i][j].status,
                }
                for name, g in grades.items()
            }
            records.append(
                {
                    "problem_id": problem["id"],
                    "sample_index": j,
                    "gold": problem["answer"],
                    "completion": s.text,
                    "num_tokens": len(s.token_ids),
                    "finish_reason": s.finish_reason,
                    "scorers": scores,
                }
            )
    return records


def build_summary(
    cfg: EvalConfig,
    bench: Benchmark,
    samples: list[list[Sample]],
    grades: dict[str, list[list]],
    checkpoint_sha: str,
    kl_block: dict | None = None,
) -> dict:
    """The summary JSON (schema in docs/evaluation.md); `kl_block` is eval.kl's estimate of
    the KL to the initial model (absent: the checkpoint names no initial model)."""
    summary = {
        "benchmark": bench.name,
        "step": cfg.step,
        "checkpoint": cfg.checkpoint,
        "model_sha256": checkpoint_sha,
        "source": bench.source,
        "sampling": {
            "backend": cfg.backend,
            "n": cfg.n,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "max_new_tokens": cfg.max_new_tokens,
            "seed": cfg.seed,
            "template": cfg.template,
            "enable_thinking": cfg.enable_thinking,
        },
        "num_problems": len(bench.problems),
        "truncation_rate": metrics.truncation_rate([s.finish_reason for p in samples for s in p]),
        "scorers": {
            name: metrics.summarize_scorer(g, seed=cfg.seed, ks=cfg.ks)
            for name, g in grades.items()
        },
    }
    if kl_block is not None:
        summary["kl_to_initial"] = kl_block
    return summary


def summary_metrics(summary: dict) -> dict[str, float]:
    """The MLflow metrics of one summary, `eval/<bench>/<scorer>/<key>` (MLflow metric
    names allow "/" but not "@", hence pass_at_k rather than pass@k)."""
    bench = summary["benchmark"]
    values = {f"eval/{bench}/truncation_rate": summary["truncation_rate"]}
    block = summary.get("kl_to_initial") or {}
    values.update({f"eval/{bench}/{key}": block[key] for key in kl.KEYS if key in block})
    for scorer, keys in summary["scorers"].items():
        for key, value in keys.items():
            values[f"eval/{bench}/{scorer}/{key}"] = value
    return values


def log_to_mlflow(summary: dict, uri: str, run_id: str) -> bool:
    """Mirror summary metrics into an existing MLflow run at the summary's step.

    Never raises: MLflow trouble only warns (and returns False); the files on disk are the
    source of truth.
    """
    try:
        from mlflow.entities import Metric

        step = summary["step"] or 0
        mlflow_client = tracking.client(uri)
        ts = int(time.time() * 1000)
        batch = [Metric(k, float(v), ts, step) for k, v in sorted(summary_metrics(summary).items())]
        mlflow_client.log_batch(run_id, metrics=batch)
    except Exception as err:  # noqa: BLE001 - logging must never fail an evaluation
        first = tracking.short_error(err)
        warnings.warn(f"MLflow logging to {uri} run {run_id} failed: {first}", stacklevel=2)
        return False
    return True


DEFAULT_TEMPLATE = "dapo"  # the paper's prompt, for a checkpoint no run of ours saved


def trained_template(checkpoint: str | Path, asked: str | None) -> str:
    """The prompt template an evaluation uses: the one the checkpoint's run trained with
    (its saved run config's task.template; a checkpoint without one: `asked`, else
    DEFAULT_TEMPLATE). Asking for another than the trained one is a ValueError naming both:
    a model scored on a prompt it never learned measures the prompt change."""
    saved = kl.saved_run_config(checkpoint)
    trained = ((saved.get("task") or {}).get("template", DEFAULT_TEMPLATE)
               if saved is not None else None)
    if trained is None:
        return asked or DEFAULT_TEMPLATE
    if asked is not None and asked != trained:
        raise ValueError(f"--template {asked}: {checkpoint} was trained with template "
                         f"{trained!r} (its {kl.CHECKPOINT_CONFIG}); evaluate with it "
                         "(drop --template)")
    return trained


def trained_thinking(checkpoint: str | Path, asked: bool | None) -> bool | None:
    """The thinking switch an evaluation passes to the chat template: the one the
    checkpoint's run trained with (task.chat.enable_thinking; a checkpoint without a saved
    config: `asked`). Asking for another is a ValueError, as for the template."""
    saved = kl.saved_run_config(checkpoint)
    if saved is None:
        return asked
    trained = ((saved.get("task") or {}).get("chat") or {}).get("enable_thinking")
    if asked is not None and asked != trained:
        raise ValueError(f"--enable-thinking {str(asked).lower()}: {checkpoint} was trained "
                         f"with task.chat.enable_thinking={trained} (its {kl.CHECKPOINT_CONFIG})"
                         "; evaluate with it (drop --enable-thinking)")
    return trained


@dataclass(frozen=True)
class Prepared:
    """A validated evaluation, ready to run: nothing heavy has happened yet."""

    cfg: EvalConfig
    bench: Benchmark
    checkpoint: Path
    model_sha256: str
    initial: str | None = None  # the initial model the KL is measured from (None: no KL)
    initial_sha256: str | None = None  # its weights' sha256 (None: a hub id)


def prepare(cfg: EvalConfig) -> Prepared:
    """Check every input (benchmark file, checkpoint + tokenizer, options) before sampling.

    Raises ValueError / FileNotFoundError (RuntimeError: hub unreachable) with a message
    naming what is wrong.
    """
    if cfg.step is None and infer_step(cfg.checkpoint) is not None:
        cfg = cfg.model_copy(update={"step": infer_step(cfg.checkpoint)})
    if cfg.mlflow_run_id is not None and cfg.mlflow_uri is None:
        raise ValueError("--mlflow-run-id needs --mlflow-uri (the store holding that run)")
    ckpt = check_checkpoint(cfg.checkpoint)
    cfg = cfg.model_copy(update={"template": trained_template(ckpt, cfg.template),
                                 "enable_thinking": trained_thinking(ckpt, cfg.enable_thinking)})
    bench = load_benchmark(cfg.benchmark, path=cfg.benchmark_file, limit=cfg.limit)
    check_examples_unseen(cfg.template, [p["problem"] for p in bench.problems],
                          f"benchmark {cfg.benchmark} ({bench.source['path_or_id']})")
    initial = kl.initial_model_of(ckpt) if cfg.kl else None
    initial_sha = model_sha256(Path(initial)) if initial and Path(initial).is_dir() else None
    return Prepared(cfg=cfg, bench=bench, checkpoint=ckpt, model_sha256=model_sha256(ckpt),
                    initial=initial, initial_sha256=initial_sha)


def engine_options(cfg: EvalConfig) -> EngineOptions:
    """What the engine is started with; the same for every evaluation it serves."""
    return EngineOptions(dtype=cfg.dtype, device=cfg.device, seed=cfg.seed,
                         batch_size=cfg.batch_size, progress=cfg.progress)


def execute(prep: Prepared, engine: Engine | None = None) -> dict:
    """Sample, grade, summarize and write one prepared evaluation; returns the summary.
    `engine` must hold `prep.checkpoint`'s weights; None starts one for it."""
    cfg, bench = prep.cfg, prep.bench
    out = Path(cfg.out)

    # -- sample --
    if engine is None:
        engine = start_engine(cfg.backend, prep.checkpoint, engine_options(cfg))
    prompts = [build_prompt(p["problem"], cfg.template, engine.tokenizer, cfg.enable_thinking)
               for p in bench.problems]
    samples = engine.generate(
        prompts,
        n=cfg.n,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed,
    )

    # -- KL to the initial model, on these samples --
    kl_block = None if prep.initial is None else measure_kl(prep, engine, prompts, samples)

    # -- grade, summarize, write --
    grades = grade_samples(bench, samples, cfg)
    records = sample_records(bench, samples, grades)
    summary = build_summary(cfg, bench, samples, grades, prep.model_sha256, kl_block)
    if cfg.greedy:  # after the sampled pass, which it leaves as it was
        for scorer, accuracy in greedy_accuracy(engine, prompts, bench, cfg).items():
            summary["scorers"][scorer]["greedy"] = accuracy
    # ensure_ascii: model output may hold lone surrogates that UTF-8 cannot encode.
    lines = "".join(json.dumps(r) + "\n" for r in records)
    write_atomic(out / f"{bench.name}.jsonl", lines)
    # The summary goes last: its presence means the per-sample file is complete too.
    write_atomic(out / f"{bench.name}.json", json.dumps(summary, indent=2) + "\n")
    if cfg.mlflow_uri is not None and cfg.mlflow_run_id is None:
        # Training could not reach MLflow, so there is no run to log into: the files are
        # written anyway and a later sync (python -m sweep mlflow-sync) attaches them.
        warnings.warn(f"no MLflow run id for {cfg.mlflow_uri} (training could not create the "
                      "run); the results are on disk only, for now", stacklevel=2)
        _note_pending(cfg, f"evaluation {bench.name} step {cfg.step}: no MLflow run id")
    elif cfg.mlflow_uri is not None:
        if not log_to_mlflow(summary, cfg.mlflow_uri, cfg.mlflow_run_id):
            _note_pending(cfg, f"evaluation {bench.name} step {cfg.step}: MLflow logging failed")
    return summary


def greedy_accuracy(engine: Engine, prompts: list[str], bench: Benchmark,
                    cfg: EvalConfig) -> dict[str, float]:
    """eval.greedy: each scorer's accuracy of one greedy answer per problem (temperature 0,
    the same prompts and token budget): what the model answers when it is surest, which a
    Mean@n at temperature > 0 does not show."""
    answers = engine.generate(prompts, n=1, temperature=0.0, top_p=1.0,
                              max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
    grades = grade_samples(bench, answers, cfg.model_copy(update={"n": 1}))
    return {scorer: sum(g[0].correct for g in per) / len(per) for scorer, per in grades.items()}


def measure_kl(prep: Prepared, engine: Engine, prompts: list[str],
               samples: list[list[Sample]]) -> dict:
    """eval.kl's block for one evaluation. The hf engine's own model scores the checkpoint
    (same weights, no second copy); any other engine's checkpoint gets a transformers copy,
    loaded here and dropped after: its sampled log-probs come from other kernels (eval/kl.py)."""
    cfg = prep.cfg
    if isinstance(engine, HFEngine):
        ckpt_model = engine.model
    else:
        ckpt_model = kl.load_scoring_model(prep.checkpoint, cfg.device, cfg.dtype)
    return kl.kl_to_initial(
        ckpt_model, prep.initial, encode_prompts(engine.tokenizer, prompts), samples,
        temperature=cfg.temperature, top_p=cfg.top_p, device=cfg.device, dtype=cfg.dtype,
        reference_sha256=prep.initial_sha256, batch_size=cfg.batch_size)


def _note_pending(cfg: EvalConfig, reason: str) -> None:
    if cfg.mlflow_pending_dir is not None:
        tracking.mark_pending(cfg.mlflow_pending_dir, reason)


def evaluate(cfg: EvalConfig) -> dict:
    """Run one evaluation as configured; returns the summary (also written to disk)."""
    return execute(prepare(cfg))


def check_shared_engine(prepared: list[Prepared]) -> None:
    """Raise ValueError unless one engine can serve every evaluation: the same engine
    settings (backend, dtype, device, batch size, seed) and checkpoints of one architecture.
    Runs before any weights load."""
    if not prepared:
        return
    first = prepared[0]
    for prep in prepared[1:]:
        for key in ("backend", "dtype", "device", "batch_size", "seed"):
            if getattr(prep.cfg, key) != getattr(first.cfg, key):
                raise ValueError(f"evaluations sharing one engine need the same {key}: "
                                 f"{getattr(first.cfg, key)!r} vs {getattr(prep.cfg, key)!r}")
        if prep.checkpoint != first.checkpoint:
            check_same_architecture(first.checkpoint, prep.checkpoint)


def execute_all(prepared: list[Prepared]) -> list[dict]:
    """Run prepared evaluations with one engine start-up: checkpoint by checkpoint (in the
    order given), every benchmark of a checkpoint before its weights are swapped out.
    Returns the summaries in the order run."""
    check_shared_engine(prepared)
    by_checkpoint: dict[Path, list[Prepared]] = {}
    for prep in prepared:
        by_checkpoint.setdefault(prep.checkpoint, []).append(prep)
    engine = None
    summaries = []
    for checkpoint, preps in by_checkpoint.items():
        if engine is None:
            engine = start_engine(preps[0].cfg.backend, checkpoint, engine_options(preps[0].cfg))
        else:
            engine.load_checkpoint(checkpoint)
        summaries.extend(execute(prep, engine) for prep in preps)
    return summaries
