"""Typed run configuration of one training run (one grid cell x seed).

    cfg = load_run_config("run.yaml")      # errors name the file and the key
    cfg.resolved_method()                  # the Method after overrides: loss, advantage, ...

Every section rejects unknown keys. Defaults give the embedded tiny CPU run (the model
path must still be given, e.g. the output of `python -m trainer tiny`). `null` in the
rollout/method sections means "the method's default" (e.g. dynamic sampling on for DAPO).
Derived values (label, the "method" tag, the MLflow URI) are filled right after parsing,
so the `config.yaml` saved in the run directory is fully resolved. The method is resolved
once: the sweep writes `method.resolved` into every run config and the trainer runs it; a
config without it (hand-written, or from before that key existed) is resolved from
`method.name` and its overrides when read, and the saved config then carries it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from algorithms import (
    CorrectionConfig,
    Method,
    get_method,
    get_objective,
    get_reference_schedule,
    with_overrides,
)
from algorithms.methods import PAPER_BETA, PAPER_CLIP
from common.generation import ENGINES
from common.grading import SCORERS
from common.layout import RunDir, SweepDir
from common.prompts import TEMPLATES
from trainer.optimizers import OPTIMIZERS

# Names come from the registries that own them; these types only spell them for pydantic.
TemplateName = TEMPLATES.Name
ScorerName = SCORERS.Name
EngineName = ENGINES.Name


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _summary(section: type[BaseModel]) -> str:
    """A section's description: the first paragraph of its docstring, on one line."""
    return " ".join((section.__doc__ or "").split("\n\n")[0].split())


class LoraSettings(_Section):
    """LoRA adapters on the policy (peft): only the adapters train.

    The learning rate is the user's (optim.lr), never changed here: the systematic study of
    LoRA in RL ("LoRA Without Regret", Thinking Machines, 2025) found its best learning rate
    about 10x full fine-tuning's, with adapters on every linear layer (the default here).
    """

    rank: int = Field(8, ge=1, description="adapter rank r (the study: even r = 1 can match "
                      "full fine-tuning in RL early on)")
    alpha: float = Field(32.0, gt=0, description="LoRA alpha: the update is scaled by "
                         "alpha / rank (the study keeps alpha = 32 for every rank)")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapters' input in the "
                           "update (the behaviour log-probs are taken without it: > 0 makes "
                           "w != 1 on-policy)")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="the linear layers that get adapters, by name (q_proj, "
        "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj for Llama/Qwen), or all-linear: "
        "every linear layer of the decoder (the LM head excluded)")


class ModelConfig(_Section):
    """The policy."""

    path: str = Field("", description="HF model directory or hub id (required)")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="storage dtype of the trainable weights (keep float32 for AdamW)"
    )
    compute_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="autocast dtype for forward passes; auto = bfloat16 on cuda"
    )
    gradient_checkpointing: bool = Field(
        False, description="recompute activations in the backward pass (memory for time; "
        "`python -m sweep.sizing` says whether a job fits without)")
    checkpointing: Literal["full", "selective"] = Field(
        "full", description="with gradient_checkpointing: full recomputes each decoder layer's "
        "forward; selective keeps its matmul and attention outputs and recomputes only the "
        "element-wise ops (norms, rotary, activations): more memory, less recompute")
    compile: bool = Field(
        False, description="torch.compile each decoder layer (regional; the first steps "
        "compile, a GPU lever: docs/performance.md); generation stays eager")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda when available")
    attn_implementation: str | None = Field(
        None, description="transformers attention: sdpa, eager, torch_varlen (padding-free "
        "micro-batches on torch's own variable-length kernel, no extra wheel; the GPU "
        "presets'), flash_attention_2 (needs the flash-attn extra), ...; null = the model's")
    reference_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="storage dtype of a held reference model (no optimizer, so no "
        "master copy needed); auto = bfloat16 when compute_dtype resolves to bfloat16")
    reference_offload: bool = Field(
        False, description="keep the held reference's shards on the CPU between its forwards "
        "(FSDP2 CPUOffloadPolicy; GPU memory for PCIe traffic, once per rollout batch)")
    lora: LoraSettings | None = Field(
        None, description="LoRA adapters (trainer.lora; null = full fine-tuning): only they "
        "train, a reference holds no copy, checkpoints hold the merged weights plus the "
        "adapters (optim.lr is not changed: the LoRA study's best lr was ~10x full "
        "fine-tuning's)")

    @model_validator(mode="after")
    def _lora_has_no_copy_to_offload(self) -> ModelConfig:
        if self.lora is not None and self.reference_offload:
            raise ValueError("model.reference_offload: with model.lora the reference is the "
                             "policy itself (adapters off or swapped), there is no copy to "
                             "offload; set reference_offload: false")
        return self


    @field_validator("attn_implementation")
    @classmethod
    def _known_attention(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from trainer.attention import implementations  # transformers: not for every config

        known = implementations()
        if v not in known:
            raise ValueError(f"unknown attention implementation {v!r}; choose one of "
                             f"{sorted(known)}")
        return v


class ChatConfig(_Section):
    """Options of the tokenizer's chat template, passed to `apply_chat_template` in training
    and evaluation alike (common.prompts.build_prompt)."""

    enable_thinking: bool | None = Field(
        None, description="thinking mode of a chat template that has one (Qwen3: a <think> "
        "block before the answer); null = the template's default (Qwen3's: on), true/false "
        "passed through; a template without the switch ignores it")


class TaskConfig(_Section):
    """Prompts and the verifiable reward."""

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, v: str) -> str:
        from trainer.tasks import task_kinds  # the registry: common.generated + math

        if v not in task_kinds():
            raise ValueError(f"unknown task kind {v!r}; choose one of {task_kinds()}")
        return v

    kind: str = Field(
        "toy", description="a generated task (common.generated: toy, the tiny model's; arithmetic, "
        "a small real model's), or math: a JSONL/parquet or hub data set")
    path: str | None = Field(
        None, description="math: local JSONL/parquet file or hub id (DAPO-Math-17k style)"
    )
    split: str = Field("train", description="math: dataset split when loading from the hub")
    problem_key: str | None = Field(None, description="math: problem column (auto: prompt/problem)")
    answer_key: str | None = Field(None, description="math: answer column (auto: answer/solution/"
                                   "reward_model.ground_truth)")
    num_prompts: int | None = Field(
        2048, ge=1, description="a generated task: problems drawn from its train split; math: "
        "limit (null=all)"
    )
    template: TemplateName = Field("dapo", description="prompt template (common.prompts)")
    chat: ChatConfig = Field(default_factory=ChatConfig, description=_summary(ChatConfig))
    scorer: ScorerName = Field("dapo", description="reward grader (common.grading); a sweep "
                               "refuses a lenient one unless allow_gameable_reward")
    allow_gameable_reward: bool = Field(
        False, description="let a sweep train on a lenient scorer (math_verify), which credits "
        "any right-looking expression anywhere in the answer, the question restated included: "
        "a policy learns to game it")
    reward_correct: float = Field(1.0, description="reward of a correct answer (DAPO: 1)")
    reward_incorrect: float = Field(-1.0, description="reward otherwise (DAPO scorer: -1)")


class RolloutConfig(_Section):
    """Sampling of responses. null = the method's default."""

    engine: EngineName = Field("hf", description="generation engine")
    n: int = Field(8, ge=1, description="responses per prompt (group size)")
    prompts_per_step: int = Field(8, ge=1, description="groups in one training batch")
    gen_prompts_per_round: int | None = Field(
        None, ge=1, description="prompts generated per dynamic-sampling round (null = "
        "prompts_per_step; the released recipe: 3 x the training batch)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass (1 = off); < 1 is "
                         "refused: the full-softmax log-probs would misstate the sampler")
    max_new_tokens: int = Field(32, ge=1, description="response length cap (tokens)")
    dynamic_sampling: bool | None = Field(
        None, description="drop groups with no learning signal (see filter_metric) and refill")
    filter_metric: Literal["acc", "score"] = Field(
        "acc", description="dynamic sampling keeps a group when 0 < #correct < n (acc, DAPO "
        "and the recipe) or when its shaped rewards differ (score)")
    max_gen_batches: int = Field(3, ge=1, description="dynamic sampling: generation rounds cap")
    overlong_shaping: bool | None = Field(None, description="DAPO soft overlong penalty")
    mask_truncated: bool = Field(
        False, description="responses cut at max_new_tokens get zero loss weight and leave the "
        "token count (TRL's mask_truncated_completions, DAPO's overlong filtering); their "
        "rewards still enter the group baseline")
    staleness: int = Field(
        0, ge=0, description="stale rollouts: step t's batch is sampled (and its behaviour "
        "log-probs recomputed) by the weights step t-k started from, k weight pushes behind "
        "the trained ones; the first k+1 steps sample from the initial weights; 0 = on-policy "
        "(trainer.staleness)")
    mode: Literal["sync", "async"] = Field(
        "sync", description="async: the engine runs in a process of its own and samples step "
        "t+1 while the trainer updates on step t (needs rollout.staleness >= 1; the same "
        "metrics as the simulated staleness, in less time: trainer.async_rollout)")
    async_threads: int = Field(
        1, ge=1, description="async on CPU: the rollout worker's threads (the trainer's "
        "command line gives the trainer the other cores)")
    gpus: int = Field(
        0, ge=0, description="async on GPUs: how many of the job's GPUs the rollout worker "
        "takes (its node's last ones; vLLM tensor-parallel over them), the trainer's ranks "
        "taking the others (resources.train.gpus counts both); 0 = the worker shares rank "
        "0's GPU (size rollout.vllm_gpu_memory_utilization for both)")
    overlong_buffer: int = Field(8, ge=1, description="tokens before max_new_tokens it starts")
    overlong_penalty: float = Field(1.0, ge=0, description="penalty at max_new_tokens")
    gen_batch_size: int = Field(256, ge=1, description="hf engine: rows per generate call")
    vllm_gpu_memory_utilization: float = Field(
        0.35, gt=0, le=1, description="vllm engine: fraction of GPU memory it may take")
    vllm_sleep_level: Literal[1, 2] | None = Field(
        None, description="vLLM sleep level between rollouts: 2 discards the weights (re-pushed "
        "after each update; TRL and verl default), 1 copies them to host and back; null = 1 "
        "when the engine serves LoRA adapters (the base is then pushed once, not after every "
        "update), else 2")
    vllm_max_model_len: int | None = Field(
        None, description="vllm engine: prompt + response token cap (null = the model's)")
    vllm_dtype: Literal["bfloat16", "float16", "float32"] | None = Field(
        None, description="vllm engine: its weights' and kernels' dtype (null = the trainer's "
        "forward dtype); bfloat16 under a float32 trainer is a real sampler mismatch on CPU")
    vllm_lora: Literal["merged", "adapters"] = Field(
        "adapters", description="vllm engine under model.lora: the base once and the adapters "
        "after every update through vLLM's LoRA (adapters, verl's way: every update reaches "
        "the sampler), or the merged weights W + s B A every step (merged, TRL's way: in bf16 "
        "the merge rounds away most of an early update; docs/performance.md \"LoRA and the "
        "sampler\")")
    correction: CorrectionConfig = Field(
        default_factory=CorrectionConfig, description="off-policy correction for the sampler mu "
        "(the engine's log-probs) differing from the trainer's pi_old (algorithms.correction)")


class ReferenceConfig(_Section):
    """Reference policy schedule (trainer.reference)."""

    schedule: str | None = Field(
        None, description="a registered schedule (algorithms.reference: rollout, fixed, "
        "every_k, kl_target); null = the method's default")
    k: int = Field(10, ge=1, description="every_k: optimizer steps between refreshes")
    kappa: float = Field(0.05, gt=0, description="kl_target: refresh when the KL average > kappa")
    kl_ema: float = Field(0.9, ge=0, lt=1, description="kl_target: moving-average factor")
    kl_metric: Literal["kl_ref_k1", "kl_ref_k3"] = Field(
        "kl_ref_k3", description="kl_target: the logged KL estimate it averages")

    @field_validator("schedule")
    @classmethod
    def _registered(cls, v: str | None) -> str | None:
        if v is not None:
            get_reference_schedule(v)  # raises, listing the registered schedules
        return v


class MethodConfig(_Section):
    """The algorithm: a registered method plus overrides, or an explicit loss."""

    name: str | None = Field(
        "RPG-REINFORCE-URKL", description="an algorithms.METHODS key, or null for `loss` alone"
    )
    loss: dict[str, Any] = Field(
        default_factory=dict, description="LossConfig field overrides (full LossConfig if no name)"
    )
    advantage: str | None = Field(None, description="advantage estimator override")
    reference: ReferenceConfig = Field(default_factory=ReferenceConfig,
                                       description="reference policy schedule (trainer.reference)")
    resolved: Method | None = Field(
        None, description="the method after overrides, as the sweep resolved it (written into "
        "every run config); the trainer runs this one. Absent (a hand-written or older "
        "config): resolved once from name and overrides when the config is read")


def resolve_method(spec: MethodConfig, dynamic_sampling: bool | None = None,
                   overlong_shaping: bool | None = None) -> Method:
    """The one resolution of a method: the registered `spec.name` (or a custom loss) with the
    spec's loss, advantage and reference overrides and the rollout's DAPO switches (None =
    the method's own). The sweep calls it per grid cell; a run config without
    `method.resolved` calls it once when read. Raises ValueError for an unregistered name,
    pydantic's ValidationError for an override the method rejects."""
    m = spec
    if m.name is not None:
        base = get_method(m.name)
    else:
        if not m.loss:
            raise ValueError("method.name is null, so method.loss must give a full LossConfig")
        # A custom loss defaults to the paper's clip and beta where it does not say.
        base = Method(name="custom", loss={"objective": "rpg", "divergence": "urkl",
                                           "clip": PAPER_CLIP, "beta": PAPER_BETA},
                      advantage="group_mean")
    loss = dict(m.loss)
    if isinstance(loss.get("clip"), dict) and base.loss.clip is not None:
        loss["clip"] = {**base.loss.clip.model_dump(), **loss["clip"]}
    if m.name is None:
        loss = {"objective": "rpg", **loss}
    fields: dict[str, Any] = {}
    if m.advantage is not None:
        fields["advantage"] = m.advantage
    if m.reference.schedule is not None:
        fields["reference"] = m.reference.schedule
    if dynamic_sampling is not None:
        fields["dynamic_sampling"] = dynamic_sampling
    if overlong_shaping is not None:
        fields["overlong_shaping"] = overlong_shaping
    return with_overrides(base, loss=loss or None, **fields)


class OptimConfig(_Section):
    """AdamW (or schedule-free AdamW) with linear warmup then constant LR; K epochs of
    mini-batch updates per step."""

    optimizer: OPTIMIZERS.Name = Field(
        "adamw", description="a registered optimizer (trainer.optimizers.OPTIMIZERS); "
        "schedule-free checkpoints hold its averaged weights x")
    steps: int = Field(100, ge=1, description="RL steps (one rollout batch each)")
    lr: float = Field(2e-4, gt=0, description="tiny default; the paper uses 1e-6 at 4B-8B")
    warmup_rl_steps: int = Field(
        0, ge=0, description="linear LR warm-up, counted in RL steps (rollout batches), not "
        "optimizer updates: the scheduler steps once per RL step, as verl's does")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW (beta1, beta2)")
    grad_clip: float | None = Field(1.0, gt=0, description="max grad norm (null = off)")
    epochs: int = Field(1, ge=1, description="K passes over each rollout batch")
    mini_batch_size: int | None = Field(
        None, ge=1, description="sequences per optimizer step (null = the whole batch)"
    )
    micro_batch_size: int = Field(64, ge=1, description="sequences per forward/backward (at most)")
    max_tokens_per_micro_batch: int | None = Field(
        None, ge=1, description="token budget per forward/backward: rows sorted by length are "
        "packed up to this many (padded) prompt+response tokens (null = micro_batch_size rows "
        "in order)")
    padding_free: bool = Field(
        False, description="concatenate a micro-batch's rows into one sequence (position ids "
        "restart per row) instead of padding them: no pad token is computed. Fast with "
        "model.attn_implementation: torch_varlen (or flash_attention_2): variable-length "
        "kernels; sdpa/eager get a dense block-diagonal mask. The token budget then counts "
        "real tokens")
    share_prompt: bool = Field(
        False, description="compute each distinct prompt of a forward once and copy its KV "
        "cache to the rows that share it (as the hf engine's prefill does): the same log-probs "
        "and gradients, in other last bits, from U*P + B*T instead of B*(P+T) token positions "
        "(U distinct prompts, P prompt and T response tokens); pays off when prompts are long "
        "against responses (the tiny default: ~70 vs ~17). Not with padding_free or "
        "model.gradient_checkpointing")
    whole_groups: bool = Field(
        False, description="mini-batches hold whole groups (a prompt's rollout.n rows), the "
        "groups shuffled per epoch, as verl's contiguous mini-batch split keeps them together "
        "(false: rows shuffled one by one); with share_prompt a mini-batch then computes "
        "mini_batch_size / rollout.n prompts. Needs mini_batch_size a multiple of rollout.n")
    max_nonfinite_in_row: int = Field(3, ge=1, description="stop after this many skipped updates")


class CheckpointConfig(_Section):
    """HF checkpoints for evaluation and the resume state."""

    eval_steps: list[int] = Field(default_factory=list, description="also saved: the last step")
    wall_clock_minutes: float | None = Field(
        30.0, gt=0, description="save the resume state at least this often (null = off)"
    )
    state_every_steps: int | None = Field(
        None, ge=1, description="also save the resume state every N steps"
    )
    save_dtype: Literal["same", "float32", "bfloat16", "float16"] = Field(
        "same", description="dtype of the HF checkpoints' weights (same = model.dtype)")
    keep_state: bool = Field(False, description="keep state/ after the run is DONE")
    deadline_margin_s: float = Field(
        60.0, ge=0, description="with a job deadline (--deadline or SLURM_JOB_END_TIME): "
        "stop this long before it, on top of the longest step and state save seen")


class TrackingConfig(_Section):
    """metrics.jsonl is always written; MLflow mirrors it."""

    mlflow_uri: str | None = Field(
        "auto", description="auto = the sweep's sqlite database (common.layout: "
        "<sweep>/mlflow.db for out_dir <sweep>/runs/<run_id>); null = no MLflow")
    experiment: str = Field("rpg-harness", description="MLflow experiment name")
    parent_run_id: str | None = Field(
        None, description="MLflow run to nest under (the sweep's; --parent-run-id-file)")
    progress: bool = Field(True, description="show a progress bar on stderr")


class DebugConfig(_Section):
    """Fault-injection hooks for tests and drills; leave empty in real runs."""

    stop_after_steps: int | None = Field(
        None, ge=1, description="save the resume state and return after this many steps"
    )
    nonfinite_steps: list[int] = Field(
        default_factory=list, description="steps whose loss is replaced by NaN (guard drill)"
    )
    sleep_per_step_s: float = Field(
        0.0, ge=0, description="seconds slept after each step (drills that need a run to "
        "last, e.g. a scheduler's time-limit warning arriving mid-run)")
    fail_at: tuple[int, int] | None = Field(
        None, description="[rank, step]: that rank raises at the start of that step (drill: "
        "one failing rank must end a distributed job)")
    signal_in_checkpoint: int | None = Field(
        None, ge=1, description="step whose HF checkpoint write sends SIGTERM to its own "
        "process (rank 0, the writer) before writing (drill: a signal landing inside a save "
        "is handled at the next step, which saves its state before exiting 75)")
    signal_in_update: int | None = Field(
        None, ge=1, description="step whose update sends SIGTERM to its own process (rank 0) "
        "before it starts (drill: a signal during the update is handled at the step's end)")
    rollout_worker_fault: tuple[int, Literal["raise", "exit", "exit_loading"]] | None = Field(
        None, description="[step, raise|exit|exit_loading]: under rollout.mode async the "
        "rollout worker raises, or exits at once with code 17, when asked for that step's "
        "first round; exit_loading: exits with 17 on receiving the weights of that step, "
        "their file unread (drill: a dead worker must end the job with its error and leave "
        "no file)")
    rollout_delay_s: float = Field(
        0.0, ge=0, description="seconds the async rollout worker sleeps before each generate "
        "(drill: the other ranks wait longer than RPG_COLLECTIVE_TIMEOUT_S for rank 0's "
        "worker, as they do for hours at the paper's sizes, and the run must not time out)")
    rollout_wrong_weights: int | None = Field(
        None, ge=1, description="under rollout.mode async the worker skips loading the "
        "weights of this step and samples with those it holds, under the step's label "
        "(drill: the weights' fingerprint must stop the run)")
    fail_in_setup: Literal["tracker", "config"] | None = Field(
        None, description="set-up raises an OSError at this point, after the rollout worker "
        "started (drill: no process or file may outlive a failed set-up)")
    sleep_in_setup_s: float = Field(
        0.0, ge=0, description="seconds set-up sleeps after the rollout worker started, "
        "before the config and the tracker (drill: a signal during set-up)")


class RunConfig(_Section):
    """One training run. Saved resolved as `<out_dir>/config.yaml`."""

    run_id: str = Field("tiny", description="stable id of the cell x seed (sweep.expand)")
    label: str = Field("", description="display name of the grid cell (default: method name)")
    seed: int = Field(0, description="global seed (python, numpy, torch): sampling and data order")
    tags: dict[str, str] = Field(default_factory=dict, description="axis -> value (+ method)")
    out_dir: str = Field(str(SweepDir(Path("results") / "default").run("tiny")),
                         description="the run directory (common.layout.RunDir): config, "
                         "metrics, checkpoints, state, eval")
    model: ModelConfig = Field(default_factory=ModelConfig, description=_summary(ModelConfig))
    task: TaskConfig = Field(default_factory=TaskConfig, description=_summary(TaskConfig))
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description=_summary(RolloutConfig))
    method: MethodConfig = Field(default_factory=MethodConfig, description=_summary(MethodConfig))
    optim: OptimConfig = Field(default_factory=OptimConfig, description=_summary(OptimConfig))
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description=_summary(CheckpointConfig))
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description=_summary(TrackingConfig))
    debug: DebugConfig = Field(default_factory=DebugConfig, description=_summary(DebugConfig))

    @model_validator(mode="after")
    def _resolve(self) -> RunConfig:
        method = self.method.resolved = self._resolve_method()  # raises naming the key
        if not self.label:
            self.label = self.method.name or "custom"
        if "method" not in self.tags:
            self.tags = {**self.tags, "method": method.name}
        if self.tracking.mlflow_uri == "auto":
            db = RunDir(self.out_dir).sweep.mlflow_db.resolve()  # the sweep's database
            self.tracking.mlflow_uri = f"sqlite:///{db}"
        for s in self.checkpoint.eval_steps:
            if not 1 <= s <= self.optim.steps:
                raise ValueError(f"checkpoint.eval_steps: {s} is outside 1..optim.steps="
                                 f"{self.optim.steps}")
        batch = self.rollout.n * self.rollout.prompts_per_step
        mini = self.optim.mini_batch_size or batch
        if mini > batch:
            raise ValueError(f"optim.mini_batch_size={mini} exceeds the batch of "
                             f"rollout.n * rollout.prompts_per_step = {batch} sequences")
        o = self.optim
        if o.whole_groups and mini % self.rollout.n:
            raise ValueError(f"optim.whole_groups needs optim.mini_batch_size={mini} to be a "
                             f"multiple of rollout.n={self.rollout.n} (whole groups per "
                             "mini-batch); change one of them or set whole_groups: false")
        if o.share_prompt and (o.padding_free or self.model.gradient_checkpointing):
            other = "optim.padding_free" if o.padding_free else "model.gradient_checkpointing"
            raise ValueError(f"optim.share_prompt runs the prompts through a KV cache, which "
                             f"{other} does not keep; set one of them to false")
        objective = get_objective(method.loss.objective)
        if self.rollout.top_p < 1 and objective.uses_behaviour:
            raise ValueError(
                f"rollout.top_p={self.rollout.top_p}: the sampler then draws from the nucleus-"
                "truncated distribution but the trainer's log-probs are full-softmax, so every "
                f"importance weight of objective {objective.name!r} is against the wrong "
                "behaviour policy; set rollout.top_p: 1 (eval.top_p is not affected)")
        if self.rollout.mode == "async" and self.rollout.staleness < 1:
            raise ValueError(
                "rollout.mode=async samples step t+1 while step t updates, with weights "
                "that exist before that update: set rollout.staleness >= 1 (1 = one step "
                "off, as verl's one-step-off) or rollout.mode: sync")
        if self.rollout.gpus and self.rollout.mode != "async":
            raise ValueError(
                f"rollout.gpus={self.rollout.gpus} gives GPUs to a rollout worker, which only "
                "rollout.mode: async has: set rollout.mode: async (with rollout.staleness >= "
                "1) or rollout.gpus: 0")
        if self.rollout.gpus > 1 and self.rollout.engine != "vllm":
            raise ValueError(
                f"rollout.gpus={self.rollout.gpus}: the hf engine samples on one GPU; set "
                "rollout.engine: vllm (tensor parallel over the worker's GPUs) or "
                "rollout.gpus: 1")
        if self.rollout.overlong_buffer >= self.rollout.max_new_tokens:
            raise ValueError(f"rollout.overlong_buffer={self.rollout.overlong_buffer} must be "
                             f"< rollout.max_new_tokens={self.rollout.max_new_tokens}")
        return self

    def resolved_method(self) -> Method:
        """The method this run trains with: `method.resolved`, filled once at validation."""
        assert self.method.resolved is not None, "set by RunConfig's validator"
        return self.method.resolved

    def _resolve_method(self) -> Method:
        """`method.resolved` as given (the sweep's), checked against the keys that would
        contradict it; else resolved now from name and overrides (`resolve_method`)."""
        m, rollout = self.method, self.rollout
        if m.resolved is not None:
            if m.name is not None and m.name != m.resolved.name:
                raise ValueError(f"method.name={m.name!r} but method.resolved.name="
                                 f"{m.resolved.name!r}: method.resolved is what runs; delete "
                                 "method.resolved to resolve method.name again")
            for key in ("dynamic_sampling", "overlong_shaping"):
                given = getattr(rollout, key)
                if given is not None and given != getattr(m.resolved, key):
                    raise ValueError(f"rollout.{key}={given} but method.resolved.{key}="
                                     f"{getattr(m.resolved, key)}: method.resolved is what "
                                     f"runs; set rollout.{key}: null or delete method.resolved")
            return m.resolved
        try:
            return resolve_method(m, rollout.dynamic_sampling, rollout.overlong_shaping)
        except ValidationError as e:
            raise ValueError(_format_errors(e, prefix="method.loss.")) from None
        except ValueError as e:
            raise ValueError(f"method.name: {e}" if m.name is not None else str(e)) from None


def _format_errors(err: ValidationError, prefix: str = "") -> str:
    """One line per error: dotted key, message, bad value (cross-field errors name their keys)."""
    lines = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        if not e["loc"]:
            lines.append(msg)
            continue
        key = prefix + ".".join(str(x) for x in e["loc"])
        value = e.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        lines.append(f"{key}: {msg}{shown}")
    return "; ".join(lines)


def parse_run_config(data: dict, source: str = "<dict>") -> RunConfig:
    """Validate a dict; a ValueError names `source` and each bad key."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: a run config must be a mapping, got {type(data).__name__}")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ValueError(f"{source}: invalid run config: {_format_errors(e)}") from None


def load_run_config(path: str | Path) -> RunConfig:
    """Read and validate a YAML run config; errors name the file and the key."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"run config {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    return parse_run_config(data, str(path))


HUB_PROBE_TIMEOUT_S = 10.0


def check_model_path(path: str, *, probe_hub: bool = True) -> None:
    """Fail in seconds, with the key and the fix, unless `model.path` can be loaded.

    Accepted: a directory holding an HF `config.json`, or a hub id (`org/name`) that is in
    the local HF cache or, with `probe_hub`, that the hub knows (one request, no retries:
    transformers would retry an unreachable hub for ~50 s before failing). Without
    `probe_hub` (the sweep's parse-time check: no network) a well-formed hub id passes.
    Raises ValueError naming `model.path`.
    """
    if not path:
        raise ValueError("model.path is required: an HF model directory or a hub id "
                         "(e.g. the output of `python -m trainer tiny --out DIR`)")
    local = Path(path).expanduser()
    from trainer.pretrained import is_prepared

    if is_prepared(path) and not local.is_dir():
        raise ValueError(f"model.path={path!r} names a model the workflow prepares: in a sweep it "
                         f"is converted for you; for the trainer alone run `python -m trainer "
                         f"prepare {path} --out DIR` and give model.path: DIR")
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ValueError(f"model.path={path!r} is a directory without config.json; give "
                             "a directory written by save_pretrained (weights + tokenizer)")
        return
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(path)
    except HFValidationError:
        raise ValueError(f"model.path={path!r} is neither an existing directory nor a hub id "
                         "(org/name); fix the path") from None
    if not probe_hub:
        return
    import huggingface_hub
    from huggingface_hub import constants

    if isinstance(huggingface_hub.try_to_load_from_cache(path, "config.json"), str):
        return  # in the local cache: loads offline
    if constants.HF_HUB_OFFLINE:
        raise ValueError(f"model.path={path!r} is not a local directory and not in the HF cache "
                         "(HF_HUB_OFFLINE is set); download it first or fix the path")
    try:
        huggingface_hub.model_info(path, timeout=HUB_PROBE_TIMEOUT_S)
    except huggingface_hub.errors.RepositoryNotFoundError:
        raise ValueError(f"model.path={path!r}: no such model on the Hugging Face hub (nor a "
                         "local directory); fix the id or the path") from None
    except huggingface_hub.errors.HfHubHTTPError as exc:
        status = getattr(exc.response, "status_code", None)
        if status in (401, 403):
            return  # gated or private: the download will ask for a token
        raise ValueError(f"model.path={path!r}: the Hugging Face hub answered {status}; "
                         "download the model first or give a local directory") from None
    except Exception as exc:  # noqa: BLE001 - network errors come from several libraries
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"model.path={path!r} is not a local directory and the Hugging Face "
                         f"hub cannot be reached ({first}); download the model first "
                         "(`hf download ID`) or give a local directory") from None


def dump_run_config(cfg: RunConfig) -> str:
    """The resolved config as YAML (what `<out_dir>/config.yaml` holds)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
