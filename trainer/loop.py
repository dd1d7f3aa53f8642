"""The RL loop for one grid cell: rollout, reward, advantage, update, log, checkpoint.

    python -m trainer --config run.yaml            # or: python -m trainer train --config ...
    from trainer.loop import train; train(cfg)     # -> the run directory

Each step: draw prompts -> n responses each (hf or vllm engine) -> rewards from the
evaluation grader (+ DAPO overlong shaping; dynamic sampling drops all-equal groups and
refills) -> behaviour log-probs recomputed by the weights that sampled (no grad: the
training model, or its lagged copy under rollout.staleness, trainer.staleness) -> reference
log-probs per the schedule (none for "rollout") -> advantages -> K epochs of mini-batch
AdamW updates with `algorithms.compute_policy_loss` (gradient accumulation over
micro-batches, clipping, a non-finite guard) -> reference schedule -> metrics.jsonl +
MLflow -> HF checkpoint if due, resume state if due. A run with a resume state continues
from it; on CPU the resumed metrics equal an uninterrupted run's exactly.

Legend: G groups (prompts) kept, n responses per prompt, B = G * n sequences, T response
length (padded), P prompt length (padded).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import signal
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from algorithms import (
    CORRECTION_METRICS,
    LOSS_METRICS,
    compute_advantages,
    compute_policy_loss,
    correct,
    kl_reward_penalty,
)
from common.files import read_yaml, write_atomic
from common.layout import RunDir
from common.metrics import metric_meta
from common.prompts import build_prompt, encode_prompts
from trainer import distributed, lora
from trainer.checkpoint import (
    Preempted,
    PreemptionFlag,
    load_sharded_state,
    load_state,
    remove_state,
    save_hf_checkpoint,
    save_sharded_state,
)
from trainer.config import RunConfig, dump_run_config
from trainer.deadline import Deadline
from trainer.logprobs import PackedBatch, PolicyLogProbs, balanced_share, micro_batches, pack
from trainer.optimizers import build_optimizer, evaluation_weights
from trainer.parallelize import check_attention, parallelize
from trainer.reference import Reference
from trainer.rollout import logprob_gap, make_engine, sampler_logprobs
from trainer.runtime import autocast_dtype, resolve_device, torch_dtype, tune_cpu_runtime
from trainer.staleness import WeightLag, check_resume, check_world
from trainer.tasks import load_problems, score
from trainer.tracking import Tracker

# Loss metrics reported as the maximum over a step's updates (micro-batches, mini-batches,
# epochs, ranks): those whose declared aggregation is "max"; the rest are weighted means.
MAX_OVER_UPDATES = frozenset(k for k in LOSS_METRICS if metric_meta(k).aggregation == "max")


def mb_rows(micro: torch.Tensor, device) -> torch.Tensor:
    """Row indices of a micro-batch; row 0 for the empty stand-in (weighted by 0)."""
    return micro if len(micro) else torch.zeros(1, dtype=torch.long, device=device)


def add_metric(sums: dict, key: str, value: torch.Tensor, weight=None) -> None:
    """Running aggregate of a loss metric over micro- and mini-batches: the maximum for
    MAX_OVER_UPDATES, else the (weighted) sum."""
    if key in MAX_OVER_UPDATES:
        sums[key] = value if key not in sums else torch.maximum(sums[key], value)
    else:
        sums[key] = sums.get(key, 0.0) + (value if weight is None else value * weight)


class NonFiniteError(RuntimeError):
    """Too many non-finite updates in a row."""


# ---------------------------------------------------------------------------- setup helpers


def load_device(world, device: torch.device) -> torch.device:
    """Where `load_policy` puts the weights: the CPU when they will be sharded (FSDP2 moves
    each rank's shards to its device), else the run's device."""
    return torch.device("cpu") if world.distributed else device


def reference_dtype(name: str, autocast: torch.dtype | None) -> torch.dtype | None:
    """model.reference_dtype as a dtype; auto: bf16 when computing in bf16, else as stored."""
    if name == "auto":
        return torch.bfloat16 if autocast == torch.bfloat16 else None
    return torch_dtype(name)


def load_policy(model_cfg, device: torch.device, empty: bool = False):
    """Model (train mode, `dtype` weights, `attn_implementation`) and tokenizer (pad token
    guaranteed), as stored: `trainer.parallelize` sets it up to compute. `empty`:
    parameters on the meta device, the weights file unread (distributed ranks but 0)."""
    if not model_cfg.path:
        raise ValueError("model.path is required (an HF model directory or hub id; for the "
                         "tiny default build one with `python -m trainer tiny --out DIR`)")
    # Never the model repository's own code: checkpoints are data (docs/security.md).
    tokenizer = AutoTokenizer.from_pretrained(model_cfg.path, trust_remote_code=False)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    check_attention(model_cfg.attn_implementation, device.type)
    kwargs = {"dtype": torch_dtype(model_cfg.dtype), "trust_remote_code": False}
    if model_cfg.attn_implementation:
        kwargs["attn_implementation"] = model_cfg.attn_implementation
    model = (distributed.empty_model(model_cfg.path, **kwargs) if empty else
             AutoModelForCausalLM.from_pretrained(model_cfg.path, **kwargs).to(device))
    model.train()
    return model, tokenizer


class PromptSampler:
    """Prompt indices in seeded per-epoch permutations; its position is part of the resume state."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed = size, seed
        self.epoch, self.pos = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(self.size))
        random.Random(f"prompts-{self.seed}-{epoch}").shuffle(order)
        return order

    def take(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.pos == self.size:
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            out.append(self._order[self.pos])
            self.pos += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._permutation(self.epoch)


def generation_seed(seed: int, step: int, gen_batch: int) -> int:
    """A distinct, reproducible sampling seed per (run seed, step, generation batch)."""
    return (seed * 1_000_003 + step * 1_009 + gen_batch * 7) % (2**31 - 1)


def overlong_penalty(length: int, max_new_tokens: int, buffer: int, penalty: float) -> float:
    """DAPO soft overlong punishment: 0 up to max-buffer, then linear down to -penalty at max."""
    start = max_new_tokens - buffer
    return -penalty * min(1.0, (length - start) / buffer) if length > start else 0.0


def has_signal(rewards: list[float], correct: list[bool], metric: str) -> bool:
    """Dynamic sampling's filter: keep a group only if it can teach something.

    acc (DAPO, the recipe's `filter_groups.metric=acc`): 0 < #correct < n, so an all-wrong
    group is dropped even when the overlong penalty makes its rewards differ. score: the
    shaped rewards are not all equal."""
    if metric == "acc":
        return 0 < sum(correct) < len(correct)
    return max(rewards) != min(rewards)


@dataclass
class Round:
    """One generation round of one rank: groups of n responses, prompt-major."""

    prompt_ids: list[list[int]]  # per group
    token_ids: list[list[int]]  # per response
    rewards: list[float]
    correct: list[bool]
    truncated: list[bool]
    logprobs: list[list[float] | None]  # per response: the engine's (vllm), or None (hf)


def gather_rounds(mine: Round, world: distributed.World) -> list[Round]:
    """Every rank's round, in rank order. Token ids and engine log-probs go as padded
    tensors with lengths (GBs of Python objects per rank at paper scale otherwise); the
    per-response scalars ride along as rows of length 1."""
    if not world.distributed:
        return [mine]
    ids = distributed.gather_ragged(mine.prompt_ids + mine.token_ids, world, torch.long)
    # float64: log-probs, rewards and flags come back exactly as they went in.
    has_lp = [lp is not None for lp in mine.logprobs]
    scalars = [[float(x), float(c), float(t), float(h)] for x, c, t, h in
               zip(mine.rewards, mine.correct, mine.truncated, has_lp)]
    floats = distributed.gather_ragged([lp or [] for lp in mine.logprobs] + scalars, world,
                                       torch.float64)
    out = []
    for rank_ids, rank_floats in zip(ids, floats):
        n_groups = len(rank_ids) - len(rank_floats) // 2
        m = len(rank_floats) // 2
        lps, sc = rank_floats[:m], rank_floats[m:]
        out.append(Round(
            prompt_ids=rank_ids[:n_groups], token_ids=rank_ids[n_groups:],
            rewards=[row[0] for row in sc], correct=[bool(row[1]) for row in sc],
            truncated=[bool(row[2]) for row in sc],
            logprobs=[lp if row[3] else None for lp, row in zip(lps, sc)]))
    return out


@dataclass
class Group:
    """One kept group: a prompt and its n responses, with what the update needs of them."""

    prompt_ids: list[int]
    token_ids: list[list[int]]  # per response
    rewards: list[float]
    logprobs: list[list[float] | None]  # per response: the sampler's (mu), or None (hf)
    truncated: list[bool]


@dataclass
class Rollout:
    """One step's training batch (kept groups) plus stats over everything generated."""

    batch: PackedBatch | None
    rewards: torch.Tensor  # (B,)
    group_ids: torch.Tensor  # (B,) long
    stats: dict = field(default_factory=dict)
    engine_logprobs: list | None = None  # per row: the engine's log-probs of its tokens
    truncated: torch.Tensor | None = None  # (B,) bool: cut at max_new_tokens


def _generation_stats(rewards: list[float], correct: list[bool], lengths: list[int],
                      truncated: list[bool]) -> dict:
    """Reward, accuracy and length statistics over every response generated in a step."""
    rw = torch.tensor(rewards, dtype=torch.float32)
    return {
        "reward_mean": rw.mean().item(), "reward_std": rw.std(unbiased=False).item(),
        "acc_mean": float(np.mean(correct)),
        "response_length_mean": float(np.mean(lengths)),
        "response_length_max": int(max(lengths)),
        "truncated_frac": float(np.mean(truncated)),
    }


def loss_batch(batch: PackedBatch, truncated: torch.Tensor, mask_truncated: bool) -> PackedBatch:
    """The batch the update sees: with `rollout.mask_truncated`, responses cut at
    max_new_tokens get an all-zero response mask, so they add nothing to the loss nor to
    the token-mean's token count (TRL's mask_truncated_completions zeroes its completion
    mask the same way). Their rewards still count in the group baselines, as in TRL."""
    if not mask_truncated:
        return batch
    keep = (~truncated).to(batch.response_mask.dtype)[:, None]  # (B, 1)
    return PackedBatch(batch.input_ids, batch.attention_mask, batch.response_mask * keep,
                       batch.prompt_len)


def learning_rate(optim, step: int) -> float:
    """The LR of RL step `step` (1-based): linear warm-up over `optim.warmup_rl_steps` RL
    steps, then constant. Counted in RL steps, as verl steps its scheduler once per training
    step; unlike verl's schedule, step 1 gets lr / warmup instead of 0 (no wasted step).
    A function of the step alone, so a resumed run needs no scheduler state."""
    if optim.warmup_rl_steps <= 0:
        return optim.lr
    return optim.lr * min(1.0, step / optim.warmup_rl_steps)


# ---------------------------------------------------------------------------- the trainer


class Trainer:
    """One training run as a recipe (torchtune's lifecycle), composing the policy, the
    generation engine, the reference and the tracker:

        trainer = Trainer(cfg)       # the config, device and process group; nothing heavy
        trainer.setup()              # model, reference, optimizer, engine; the resume state
        metrics = trainer.step()     # one RL step: rollout, reward, advantage, update
        trainer.log(metrics)         # metrics.jsonl + MLflow (rank 0)
        trainer.save(force_state=)   # what is due: HF checkpoint, resume state
        trainer.cleanup(status)      # tracking closed; on success the state goes, DONE last

    `train(cfg)` drives it and owns the loop's stop decisions (deadline, signals). Under
    FSDP2 every rank runs the same calls; rank 0 alone writes files and talks to MLflow.
    """

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.run = RunDir(cfg.out_dir)
        self.method = cfg.resolved_method()
        self.loss_cfg = self.method.loss
        self.device = resolve_device(cfg.model.device)
        self.world = distributed.init(self.device.type)
        if self.device.type == "cuda":
            self.device = torch.device("cuda", self.world.local_rank)
        self.autocast = autocast_dtype(cfg.model.compute_dtype, self.device)
        self.config_yaml = dump_run_config(cfg)
        ck = cfg.checkpoint
        self.save_dtype = None if ck.save_dtype == "same" else torch_dtype(ck.save_dtype)
        self.global_step = 0
        self.nonfinite_skips = 0
        self.nonfinite_in_row = 0
        self.last_checkpoint: Path | None = None
        self.last_state_time = time.monotonic()
        self.tracker: Tracker | None = None

    # -------------------------------------------------------------- setup

    def setup(self, *, track: bool = True) -> None:
        """Build every part, resume from the run's state if it has one, then (with `track`,
        rank 0) write the resolved config and open the tracker. `track=False` builds the
        parts only and writes nothing (tests and benchmarks that drive single steps)."""
        cfg = self.cfg
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        # Distributed: rank 0 alone reads the weights, on the CPU; they reach each GPU only
        # as FSDP2 shards (a full fp32 copy per GPU would peak at ~16 GB for 4B parameters).
        self.model, self.tokenizer = load_policy(cfg.model, load_device(self.world, self.device),
                                                 empty=self.world.distributed and not self.world.main)
        # LoRA: adapters injected in place (self.model stays the HF model); self.peft saves them
        self.peft = lora.apply_lora(self.model, cfg.model.lora) if cfg.model.lora else None
        self.problems = load_problems(cfg.task, seed=cfg.seed)
        self.sampler = PromptSampler(len(self.problems), cfg.seed)
        self._check_world_size()
        self._setup_models()
        self.optimizer = build_optimizer(lora.trainable(self.policy), cfg.optim)
        self._resume()
        self.engine = make_engine(cfg.rollout, self.sampling_model, self.tokenizer,
                                  model_path=cfg.model.path, seed=cfg.seed,
                                  compute_dtype=self.autocast)
        if self.global_step > 0:
            self.engine.sync_weights(self.sampling_model)
        if track and self.world.main:
            _write_config(self.run.config, cfg, self.config_yaml, resumed=self.global_step > 0)
            self.tracker = Tracker(self.run.root, cfg.tracking, resume_step=self.global_step,
                                   run_name=cfg.run_id, tags=cfg.tags,
                                   params=cfg.model_dump(mode="json"),
                                   config_yaml=self.config_yaml)
        self.last_state_time = time.monotonic()

    def _check_world_size(self) -> None:
        for key in ("prompts_per_step", "gen_prompts_per_round"):
            value = getattr(self.cfg.rollout, key)
            if value is not None and value % self.world.size:
                raise ValueError(f"rollout.{key}={value} must be a multiple of the world size "
                                 f"{self.world.size} (each rank generates an equal share)")

    def _setup_models(self) -> None:
        """The held copies first, from the initial weights (before any resume state is
        loaded: a "fixed" reference is the initial policy; under rollout.staleness the
        lagged generation copy), then every log-prob module set up to compute
        (`trainer.parallelize`: checkpointing for the trained one, compilation, FSDP2 roots
        when distributed; see trainer.distributed)."""
        # method.reference (a ReferenceConfig) holds the schedule's knobs; the resolved
        # method's `reference` is the schedule's name (the method's default or the override).
        ref_settings, m = self.cfg.method.reference, self.cfg.model
        schedule_name = self.method.reference
        self.ref_schedule = Reference(schedule_name, self.model,
                                      dtype=reference_dtype(m.reference_dtype, self.autocast),
                                      empty=self.world.distributed, adapters=self.peft is not None,
                                      **ref_settings.model_dump(exclude={"schedule"}))
        k = self.cfg.rollout.staleness
        check_world(k, self.world.distributed)
        # Stale rollouts (trainer.staleness): a generation copy of the initial weights that
        # samples and recomputes the behaviour log-probs; none (and no copy) at k = 0.
        self.lag = WeightLag(self.model, k) if k else None
        full = distributed.full_state_on_rank0(PolicyLogProbs(self.model), self.world)
        setup = functools.partial(parallelize, model_cfg=m, world=self.world,
                                  device_type=self.device.type, compute_dtype=self.autocast)
        self.policy = setup(self.model, train=True)
        # the reference's log-prob module: its held copy, or (LoRA) the policy's own
        copy = self.ref_schedule.model
        self.ref_policy = (setup(copy, train=False, offload=m.reference_offload)
                           if copy is not None else self.policy if self.ref_schedule.held
                           else None)
        self.behaviour_policy = (self.policy if self.lag is None
                                 else setup(self.lag.model, train=False))
        if self.world.distributed:
            roots = [self.policy] + ([self.ref_policy] if copy is not None else [])
            distributed.load_from_rank0(self.policy, full, self.world, self.device)
            if copy is not None:
                distributed.load_from_rank0(self.ref_policy, full, self.world, self.device,
                                            offload=m.reference_offload)
            del full
            # FSDP2 sets itself up at the root's first forward; generation calls the inner
            # model's layers directly, so run one root forward before any of that.
            token = [self.tokenizer.pad_token_id]
            probe = pack([token], [token], self.tokenizer.pad_token_id).to(self.device)
            with torch.no_grad():
                for module in roots:
                    module(probe)
                    module.reshard()  # so parameters() below are the sharded ones

    @property
    def sampling_model(self):
        """The model whose weights the rollouts sample from: the trained one, or the lag's."""
        return self.model if self.lag is None else self.lag.model

    def _resume(self) -> None:
        state = load_state(self.run.root)
        if state is None:
            return
        check_resume(state.get("staleness"), self.cfg.rollout.staleness)
        templates = self._sharded_state(reference="reference_weights" in state,
                                        lag_pending=(state.get("staleness") or {}).get("pending"))
        load_sharded_state(self.run.root, state, templates)
        distributed.set_sharded_state(self.policy, templates["model"], self.optimizer,
                                      templates["optimizer"])
        if "reference" in templates:
            if self.ref_schedule.lora:  # the refreshed adapters, loaded into their template
                self.ref_schedule.adapters = templates["reference"]
            else:
                distributed.set_sharded_state(self.ref_policy, templates["reference"])
        if self.lag is not None:
            self.lag.load_state_dict(templates["staleness"])
        self.sampler.load_state_dict(state["sampler"])
        self.ref_schedule.load_state_dict(state["reference"])
        self.global_step = state["step"]
        self.nonfinite_skips = state["nonfinite_skips"]
        self.nonfinite_in_row = state["nonfinite_in_row"]
        last = state.get("last_checkpoint")
        self.last_checkpoint = Path(last) if last else None
        # Checkpoint wins for: weights, optimizer, RNG, data position, reference,
        # counters. The config wins for everything else (steps, checkpoints, tracking, ...).
        print(f"[trainer] resuming {self.run} at step {self.global_step}: weights, optimizer, "
              "RNG, data position, reference and lagged weights from the state; all settings "
              "from the config")

    # -------------------------------------------------------------- save

    def _sharded_state(self, reference: bool, lag_pending: int | None = None) -> dict:
        """This rank's shards of the weights and optimizer (and the reference's weights, and
        under staleness the lag's copy and snapshots, one process only): what the resume
        state saves, and (with the saved `lag_pending` count) the templates it loads into."""
        tensors = {"model": distributed.sharded_model_state(self.policy),
                   "optimizer": distributed.sharded_optimizer_state(self.policy, self.optimizer)}
        if reference:
            tensors["reference"] = (
                self.ref_schedule.adapters or lora.adapter_snapshot(self.model)
                if self.ref_schedule.lora else distributed.sharded_model_state(self.ref_policy))
        if self.lag is not None:
            tensors["staleness"] = (self.lag.state_dict() if lag_pending is None
                                    else self.lag.templates(lag_pending))
        return tensors

    def state_payload(self) -> dict:
        """The resume state's small part (rank 0 writes it): counters, data position, the
        reference's schedule, and whether the reference's weights are saved too."""
        payload = {
            "step": self.global_step, "sampler": self.sampler.state_dict(),
            "reference": self.ref_schedule.counters(),
            "nonfinite_skips": self.nonfinite_skips, "nonfinite_in_row": self.nonfinite_in_row,
            "last_checkpoint": str(self.last_checkpoint) if self.last_checkpoint else None,
        }
        if self.ref_schedule.refreshed:
            payload["reference_weights"] = True  # its weights are saved sharded too
        if self.lag is not None:
            payload["staleness"] = self.lag.counters()  # its tensors are saved with the rest
        return payload

    def save_state(self) -> None:
        """The resume state, sharded: every rank writes its own shards of the weights and
        optimizer states (torch.distributed.checkpoint), rank 0 the rest; it resumes at any
        world size (a collective under FSDP2)."""
        payload = self.state_payload()
        tensors = self._sharded_state(reference="reference_weights" in payload)
        save_sharded_state(self.run.root, payload, tensors, step=self.global_step,
                           main=self.world.main, barrier=lambda: distributed.barrier(self.world))

    def save_checkpoint(self, path: Path, dtype: torch.dtype | None) -> Path:
        """An HF checkpoint of the policy, holding the weights evaluation should see
        (schedule-free: x, trainer.optimizers); under FSDP2 the full weights are gathered
        first (a collective) and rank 0 writes. LoRA: the merged weights under the plain HF
        names (evaluation needs no peft), the adapters beside them in `adapter/`."""
        state, extra = None, None
        with evaluation_weights(self.optimizer):
            if self.peft is not None:  # LoRA: merged weights + the adapters (collectives)
                state, adapters = lora.checkpoint_parts(self.model, keep=self.world.main)
                extra = lora.adapter_writer(self.peft, adapters)
            elif self.world.distributed:
                prefix = "model."  # PolicyLogProbs wraps the HF model as `model`
                state = {k.removeprefix(prefix): v
                         for k, v in distributed.model_state(self.policy).items()}
            if self.world.main:
                if self.cfg.debug.signal_in_checkpoint == self.global_step:
                    os.kill(os.getpid(), signal.SIGTERM)  # the drill: a signal mid-save
                save_hf_checkpoint(self.model, self.tokenizer, path,
                                   config_yaml=self.config_yaml, dtype=dtype, state_dict=state,
                                   extra=extra)
        return path

    def save(self, *, force_state: bool = False) -> float | None:
        """What is due after a step: the HF checkpoint at an eval step and at the last step;
        the resume state every `state_every_steps`, after `wall_clock_minutes`, or when
        `force_state` on any rank (a signal may reach one rank only; saving is a
        collective, so all ranks decide together). No state after the last step (cleanup
        decides). Returns the seconds the state save took, None when there was none."""
        ck, steps = self.cfg.checkpoint, self.cfg.optim.steps
        if self.global_step in ck.eval_steps or self.global_step == steps:
            self.last_checkpoint = self.save_checkpoint(
                self.run.checkpoint(self.global_step), self.save_dtype)
        due = (
            (ck.state_every_steps and self.global_step % ck.state_every_steps == 0)
            or (ck.wall_clock_minutes is not None
                and time.monotonic() - self.last_state_time > 60 * ck.wall_clock_minutes)
            or force_state
        )
        if not distributed.any_rank(bool(due), self.world) or self.global_step >= steps:
            return None
        t_save = time.monotonic()
        self.save_state()
        self.last_state_time = time.monotonic()
        return self.last_state_time - t_save

    # -------------------------------------------------------------- log and cleanup

    def log(self, metrics: dict) -> None:
        if self.tracker is not None:
            self.tracker.log(self.global_step, metrics)

    def cleanup(self, status: str) -> None:
        """End tracking with `status` (FINISHED, KILLED or FAILED). On FINISHED the final
        checkpoint and metrics are on disk: drop the resume state (unless
        `checkpoint.keep_state`) and write DONE last."""
        if self.tracker is not None:
            self.tracker.close(status)
        if status != "FINISHED":
            return
        if self.cfg.checkpoint.keep_state:
            self.save_state()
        elif self.world.main:
            remove_state(self.run.root)
        if self.world.main:
            state_dir = self.run.state_dir
            if state_dir.is_dir() and not any(state_dir.iterdir()):
                state_dir.rmdir()  # an empty state/ would suggest something to resume
            self.run.done.write_text(f"step {self.global_step}\n")

    # -------------------------------------------------------------- one step

    def _generate_round(self, problems: list[dict], seed: int) -> Round:
        """Generate and score one round's problems (this rank's share of them)."""
        r, t = self.cfg.rollout, self.cfg.task
        texts = [build_prompt(p["problem"], t.template, self.tokenizer) for p in problems]
        gather = (distributed.unsharded(self.policy, self.world) if r.engine == "hf"
                  else contextlib.nullcontext())
        # model.compile compiles the layers for the log-prob and update passes; decoding one
        # token at a time on a growing cache would recompile per length, so it runs eager.
        eager = (torch.compiler.set_stance("force_eager") if self.cfg.model.compile
                 else contextlib.nullcontext())
        with gather, eager:  # the hf engine decodes with the training model's (full) weights
            samples = self.engine.generate(texts, n=r.n, seed=seed)
        flat = [s for group in samples for s in group]
        golds = [p["answer"] for p in problems for _ in range(r.n)]
        rewards, correct = score([s.text for s in flat], golds, t)
        if self.method.overlong_shaping:
            rewards = [rw + overlong_penalty(len(s.token_ids), r.max_new_tokens,
                                             r.overlong_buffer, r.overlong_penalty)
                       for rw, s in zip(rewards, flat)]
        return Round(
            prompt_ids=encode_prompts(self.tokenizer, texts),
            token_ids=[list(s.token_ids) for s in flat], rewards=list(rewards),
            correct=list(correct), truncated=[s.finish_reason == "length" for s in flat],
            logprobs=[s.logprobs for s in flat])

    def collect(self) -> Rollout:
        """Rollout + reward (+ dynamic sampling). Stats cover every generated response.

        Every rank draws the same global prompts and generates its contiguous share; the
        rounds are gathered in rank order, so every rank holds the same kept groups in the
        single-process order and makes the same refill decision."""
        r = self.cfg.rollout
        dynamic = self.method.dynamic_sampling
        kept: list[Group] = []
        all_rewards, all_correct, lengths, truncated = [], [], [], []
        gen_batches = dropped = 0
        # Without dynamic sampling one round is the whole batch: generating
        # gen_prompts_per_round would throw the surplus groups away (and walk the data
        # faster than the recipe).
        per_round = (r.gen_prompts_per_round or r.prompts_per_step) if dynamic \
            else r.prompts_per_step
        share = per_round // self.world.size
        while True:
            idx = self.sampler.take(per_round)
            mine = idx[self.world.rank * share : (self.world.rank + 1) * share]
            seed = generation_seed(self.cfg.seed, self.global_step,
                                   gen_batches * self.world.size + self.world.rank)
            rounds = gather_rounds(
                self._generate_round([self.problems[i] for i in mine], seed), self.world)
            gen_batches += 1
            for res in rounds:
                all_rewards += res.rewards
                all_correct += res.correct
                lengths += [len(ids) for ids in res.token_ids]
                truncated += res.truncated
                for g, prompt_ids in enumerate(res.prompt_ids):
                    group = slice(g * r.n, (g + 1) * r.n)
                    group_rewards = res.rewards[group]
                    if dynamic and not has_signal(group_rewards, res.correct[group],
                                                  r.filter_metric):
                        dropped += 1
                        continue
                    kept.append(Group(prompt_ids, res.token_ids[group], group_rewards,
                                      res.logprobs[group], res.truncated[group]))
            if not dynamic or len(kept) >= r.prompts_per_step or gen_batches >= r.max_gen_batches:
                break
        # One sleep per rollout, after its last round: vLLM stays awake between rounds. Only
        # when an update follows: it re-pushes the weights a level-2 sleep discards.
        if kept:
            self.engine.sleep()
        # Extra groups from the last refill are generated but not trained on (DAPO does the same).
        groups_kept = min(len(kept), r.prompts_per_step)
        dropped += len(kept) - groups_kept
        kept = kept[:groups_kept]
        stats = {**_generation_stats(all_rewards, all_correct, lengths, truncated),
                 "groups_kept": groups_kept, "groups_dropped": dropped,
                 "gen_batches": gen_batches, "response_tokens": int(sum(lengths))}
        if not kept:
            empty = torch.zeros(0)
            return Rollout(None, empty, empty.long(), stats)
        prompts = [g.prompt_ids for g in kept for _ in g.token_ids]
        responses = [ids for g in kept for ids in g.token_ids]
        batch = pack(prompts, responses, self.tokenizer.pad_token_id).to(self.device)
        rewards = torch.tensor([x for g in kept for x in g.rewards], device=self.device)
        group_ids = torch.arange(len(kept), device=self.device).repeat_interleave(self.cfg.rollout.n)
        return Rollout(batch, rewards, group_ids, stats,
                       [lp for g in kept for lp in g.logprobs],
                       torch.tensor([t for g in kept for t in g.truncated], device=self.device))

    def _micro_batches(self, batch: PackedBatch, rows: torch.Tensor) -> list[torch.Tensor]:
        """This rank's micro-batches of `rows` (dealt to ranks by token count, so they finish
        together); padded with empty ones to the largest rank's count, since every FSDP2
        forward is a collective."""
        o = self.cfg.optim
        mine = balanced_share(batch, rows, self.world.rank, self.world.size)
        groups = micro_batches(batch, mine, o.micro_batch_size, o.max_tokens_per_micro_batch,
                               o.padding_free)
        empty = rows[:0]
        return groups + [empty] * (distributed.pad_to(len(groups), self.world) - len(groups))

    def _forward(self, module, batch: PackedBatch, micro: torch.Tensor, with_entropy: bool):
        """Row indices, sub-batch and log-probs (b, t) of one micro-batch; an empty one runs a
        1-row stand-in (so the collectives match) whose result the caller weighs by 0."""
        idx = mb_rows(micro, self.device)
        mb = batch.rows(idx)
        logp, ent = module(mb, temperature=self.cfg.rollout.temperature,
                           with_entropy=with_entropy, autocast=self.autocast,
                           padding_free=self.cfg.optim.padding_free,
                           share_prompt=self.cfg.optim.share_prompt)
        return idx, mb, logp, ent

    @torch.no_grad()
    def logprobs_no_grad(self, module, batch: PackedBatch, with_entropy: bool):
        """(B, T) log-probs (and entropies) of `module`, micro-batched, no autograd; each
        rank computes its share of the rows, then the shares are summed into every rank."""
        was_training = module.training
        module.eval()
        B, T = batch.response_mask.shape
        logp = torch.zeros(B, T, device=self.device)
        entropy = torch.zeros(B, T, device=self.device)
        for rows in self._micro_batches(batch, torch.arange(B, device=self.device)):
            _, _, lp, ent = self._forward(module, batch, rows, with_entropy)
            if len(rows):
                logp[rows, : lp.shape[1]] = lp  # a micro-batch is trimmed to its longest row
                entropy[rows, : ent.shape[1]] = ent
        module.train(was_training)
        return distributed.all_sum(logp, self.world), distributed.all_sum(entropy, self.world)

    def accumulate_gradients(self, batch: PackedBatch, rows, old_logp, ref_logp, advantages,
                             mu_logp=None):
        """Backward of one mini-batch `rows` (this rank's share of it), micro-batch by
        micro-batch, each loss weighted so that the gradients sum, over micro-batches and
        ranks, to those of the mini-batch's loss whatever the grouping. Returns the
        mini-batch loss and its weighted metric sums (maxima for MAX_OVER_UPDATES), all global."""
        token_mean = self.loss_cfg.agg == "token-mean"
        mini_tokens = batch.response_mask[rows].sum().clamp_min(1.0)
        total_loss = torch.zeros((), device=self.device)
        sums: dict[str, torch.Tensor] = {}
        for micro in self._micro_batches(batch, rows):
            bonus = self.loss_cfg.entropy_coef > 0  # entropy (and its gradient) only if used
            idx, mb, logp, ent = self._forward(self.policy, batch, micro, with_entropy=bonus)
            t = mb.response_mask.shape[1]
            loss, metrics = compute_policy_loss(
                self.loss_cfg, logp, old_logp[idx, :t],
                None if ref_logp is None else ref_logp[idx, :t],
                advantages[idx] if advantages.dim() == 1 else advantages[idx, :t],
                mb.response_mask, norm_len=self.cfg.rollout.max_new_tokens,
                entropy=ent if bonus else None, mu_logp=None if mu_logp is None else mu_logp[idx, :t],
                correction=self.cfg.rollout.correction,
            )
            if not len(micro):
                w = torch.zeros((), device=self.device)
            elif token_mean:
                w = mb.response_mask.sum() / mini_tokens
            else:
                w = torch.tensor(len(micro) / len(rows), device=self.device)
            if self.global_step in self.cfg.debug.nonfinite_steps:
                loss = loss * float("nan")
            # FSDP2 averages gradients over ranks; scaling by the world size sums them.
            (loss * w * self.world.size).backward()
            total_loss = total_loss + loss.detach() * w
            for k in LOSS_METRICS:
                if len(micro):
                    add_metric(sums, k, metrics[k], w)
        total_loss = distributed.all_sum(total_loss, self.world)
        for k in LOSS_METRICS:
            v = sums.get(k, torch.tensor(float("-inf") if k in MAX_OVER_UPDATES else 0.0,
                                         device=self.device))
            sums[k] = (distributed.all_max if k in MAX_OVER_UPDATES else distributed.all_sum)(
                v.reshape(()).clone(), self.world)
        return total_loss, sums

    def _mini_batch_order(self, epoch: int, B: int, mini: int) -> torch.Tensor:
        """The row order of one epoch: seeded per (run seed, step, epoch) when the batch is
        split into mini-batches, else the batch as it is. Rows are group-major (a group's n
        rows together); optim.whole_groups shuffles groups, keeping each one's rows together."""
        if mini >= B:
            return torch.arange(B, device=self.device)
        gen = torch.Generator().manual_seed(generation_seed(self.cfg.seed, self.global_step, epoch))
        if not self.cfg.optim.whole_groups:
            return torch.randperm(B, generator=gen).to(self.device)
        n = self.cfg.rollout.n
        groups = torch.randperm(B // n, generator=gen)  # (G,)
        return (groups[:, None] * n + torch.arange(n)).reshape(-1).to(self.device)  # (G*n,)

    def _optimizer_step(self, params: list, total_loss: torch.Tensor) -> float | None:
        """Clip, then apply the step if loss and gradient norm are finite; returns the grad
        norm, or None for a skipped (non-finite) step. Too many skips in a row raise."""
        o = self.cfg.optim
        clip = o.grad_clip if o.grad_clip is not None else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip)
        if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
            grad_norm = grad_norm.full_tensor()
        # One host sync per optimizer step: needed to decide whether to skip it.
        if bool(torch.isfinite(total_loss) & torch.isfinite(grad_norm)):
            self.optimizer.step()
            self.nonfinite_in_row = 0
            self.ref_schedule.after_optimizer_step()
            return grad_norm.item()
        self.optimizer.zero_grad(set_to_none=True)
        self.nonfinite_skips += 1
        self.nonfinite_in_row += 1
        if self.nonfinite_in_row >= o.max_nonfinite_in_row:
            raise NonFiniteError(
                f"step {self.global_step}: {self.nonfinite_in_row} non-finite losses or "
                f"gradients in a row (optim.max_nonfinite_in_row={o.max_nonfinite_in_row}); "
                f"last good checkpoint: "
                f"{self.last_checkpoint or 'none (no checkpoint saved yet)'}")
        return None

    def update(self, batch: PackedBatch, old_logp, ref_logp, advantages, mu_logp=None) -> dict:
        """K epochs of mini-batch AdamW steps; returns averaged loss metrics + grad norm.
        mu_logp: the sampler's log-probs (None: old_logp, as with the hf engine)."""
        o = self.cfg.optim
        B = batch.input_ids.shape[0]
        mini = o.mini_batch_size or B
        sums: dict[str, torch.Tensor] = {}
        grad_norms, n_mini = [], 0
        # The optimizer's (sharded) parameters: under FSDP2 the root's parameters() may be
        # its unsharded views between a forward and the next backward.
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.policy.train()
        for epoch in range(o.epochs):
            order = self._mini_batch_order(epoch, B, mini)
            for start in range(0, B, mini):
                self.optimizer.zero_grad(set_to_none=True)
                total_loss, mini_sums = self.accumulate_gradients(
                    batch, order[start : start + mini], old_logp, ref_logp, advantages, mu_logp)
                for k, v in mini_sums.items():
                    add_metric(sums, k, v)
                n_mini += 1
                grad_norm = self._optimizer_step(params, total_loss)
                if grad_norm is not None:
                    grad_norms.append(grad_norm)
        out = {k: (v if k in MAX_OVER_UPDATES else v / n_mini).item() for k, v in sums.items()}
        out["grad_norm"] = float(np.mean(grad_norms)) if grad_norms else None
        return out

    def step(self) -> dict:
        """One RL step; returns its metrics (the line metrics.jsonl gets)."""
        self.global_step += 1
        t0 = time.perf_counter()
        if self.cfg.debug.fail_at == (self.world.rank, self.global_step):
            raise RuntimeError(f"debug.fail_at: rank {self.world.rank} fails at step "
                               f"{self.global_step}")
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.cfg.optim, self.global_step)

        # -- rollout + reward (dynamic sampling refills inside)
        rollout = self.collect()
        t_rollout = time.perf_counter() - t0
        metrics: dict = {"step": self.global_step, **rollout.stats}
        tokens = metrics.pop("response_tokens")
        learned: dict = dict.fromkeys((*LOSS_METRICS, *CORRECTION_METRICS, "grad_norm", "entropy"))
        times = {"time_logprob": 0.0, "time_update": 0.0}
        if rollout.batch is not None:
            learned, times = self._learn(rollout, metrics)

        # -- log
        t_step = time.perf_counter() - t0
        metrics.update(learned)
        metrics.update({
            "lr": self.optimizer.param_groups[0]["lr"], "nonfinite_skips": self.nonfinite_skips,
            "ref_updates": self.ref_schedule.updates, "time_rollout": t_rollout, **times,
            "time_step": t_step, "tokens_per_sec": tokens / t_step if t_step > 0 else None,
        })
        return metrics

    def _push_weights(self) -> None:
        """After the update: the engine gets the weights the next rollout samples with, the
        trained ones or, under rollout.staleness, the lag's (k pushes late; every step, as
        a level-2 vLLM sleep discards them)."""
        if self.lag is None:
            self.engine.sync_weights(self.model)
            return
        self.optimizer.zero_grad(set_to_none=True)  # as sync_weights does for self.model
        self.lag.push(self.model)
        self.engine.sync_weights(self.lag.model)

    def _learn(self, rollout: Rollout, metrics: dict) -> tuple[dict, dict]:
        """Log-probs, advantages, the update and the reference schedule for a non-empty
        rollout; returns (loss metrics, timings) and adds the log-prob gap to `metrics`."""
        batch = rollout.batch
        # -- behaviour and reference log-probs (no grad; behaviour: the sampling weights)
        t1 = time.perf_counter()
        old_logp, entropy = self.logprobs_no_grad(self.behaviour_policy, batch, with_entropy=True)
        ref_logp = None
        if self.ref_schedule.held:
            with self.ref_schedule.applied(self.model):  # LoRA: the policy as the reference
                ref_logp = self.logprobs_no_grad(self.ref_policy, batch, False)[0]
        t_logprob = time.perf_counter() - t1
        mask = batch.response_mask
        # -- the sampler's log-probs mu (the engine's; pi_old itself with the hf engine)
        mu_logp = sampler_logprobs(rollout.engine_logprobs, old_logp)
        metrics.update(logprob_gap(mu_logp, old_logp, mask))
        c = self.cfg.rollout.correction
        fix = correct(old_logp, mu_logp, mask, c.mode, c.cap)  # its metrics; the loss applies it
        metrics.update(zip(fix.metrics, torch.stack(list(fix.metrics.values())).tolist()))

        # -- advantage (a KL placed in the reward becomes a token penalty first)
        penalty = kl_reward_penalty(self.loss_cfg, old_logp,
                                    ref_logp if ref_logp is not None else old_logp, mask)
        advantages = compute_advantages(rollout.rewards, rollout.group_ids,
                                        self.method.advantage, mask=mask, token_penalty=penalty)

        # -- update, then the reference schedule at the rollout boundary
        t2 = time.perf_counter()
        learned = self.update(loss_batch(batch, rollout.truncated, self.cfg.rollout.mask_truncated),
                              old_logp, ref_logp, advantages, mu_logp)
        learned["entropy"] = ((entropy * mask).sum() / mask.sum().clamp_min(1)).item()
        self._push_weights()
        t_update = time.perf_counter() - t2
        kl_ref = learned.get(self.cfg.method.reference.kl_metric)
        self.ref_schedule.after_step(self.model, kl_ref if ref_logp is not None else None)
        return learned, {"time_logprob": t_logprob, "time_update": t_update}


# ---------------------------------------------------------------------------- entry point


def _changed_keys(old: dict, new: dict, prefix: str = "") -> list[str]:
    keys = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += _changed_keys(a, b, f"{prefix}{k}.")
        elif a != b:
            keys.append(prefix + k)
    return keys


# Differs on every `snakemake` invocation by design (a new parent run each time) and changes
# nothing: a resumed run keeps its MLflow run and that run's parent.
_BOOKKEEPING_KEYS = ("tracking.parent_run_id",)


def _write_config(path: Path, cfg: RunConfig, config_yaml: str, *, resumed: bool) -> None:
    """Write the resolved config, warning when it differs from the one saved before."""
    if path.exists():
        changed = [k for k in _changed_keys(read_yaml(path), cfg.model_dump(mode="json"))
                   if k not in _BOOKKEEPING_KEYS]
        if changed and resumed:
            warnings.warn(f"{path}: the config differs from the saved one in {changed}; "
                          "the new config wins (the saved state still sets weights, optimizer, "
                          "RNG and data position)", stacklevel=4)
        elif changed:
            warnings.warn(f"{path}: the config differs from the saved one in {changed}; "
                          "there is no resume state, so the run starts again from step 0 "
                          "with the new config", stacklevel=4)
    write_atomic(path, config_yaml)


def train(cfg: RunConfig, deadline: float | None = None, until_step: int | None = None) -> Path:
    """Run (or resume) one training run; returns the run directory. See the module doc.

    deadline: the job's end (epoch seconds; trainer.deadline): the run saves its state and
    exits 75 before a step that would not finish in time. until_step: train one segment,
    up to that step (its checkpoint is written if it is an eval step), save the state and
    write the segment marker `RunDir.segment(until_step)`: the workflow then evaluates that
    checkpoint while the next segment trains."""
    run = RunDir(cfg.out_dir)
    if run.done.exists():
        print(f"[trainer] {run} is already DONE; nothing to do")
        return run.root
    run.root.mkdir(parents=True, exist_ok=True)
    tune_cpu_runtime()
    trainer = Trainer(cfg)
    trainer.setup()
    status = "FAILED"
    try:
        status = _run_steps(trainer, Deadline(deadline, margin_s=cfg.checkpoint.deadline_margin_s),
                            until_step)
    except Preempted:
        status = "KILLED"
        raise
    finally:
        trainer.cleanup(status)
        trainer.engine.engine.close()  # vLLM ends its groups while torchrun's still exists
    if until_step is not None and trainer.global_step >= until_step and trainer.world.main:
        write_atomic(run.segment(until_step), f"step {trainer.global_step}\n")
    return run.root


def _run_steps(trainer: Trainer, clock: Deadline, until_step: int | None = None) -> str:
    """Steps until the last (FINISHED), or `until_step` / `debug.stop_after_steps` (KILLED:
    the state is saved, the run resumable); raises Preempted (exit 75) after saving the
    state when a signal arrives or the next step would end past the deadline."""
    cfg, world = trainer.cfg, trainer.world
    if until_step is not None and trainer.global_step >= until_step:
        return "KILLED"  # a resumed run already past this segment
    steps_this_process = 0
    with PreemptionFlag() as flag, tqdm(
            total=cfg.optim.steps, initial=trainer.global_step, desc=cfg.run_id, unit="step",
            disable=not (cfg.tracking.progress and world.main)) as bar:
        while trainer.global_step < cfg.optim.steps:
            # Decided on all ranks together: saving is a collective.
            if distributed.any_rank(clock.must_stop(time.time()), world):
                trainer.save_state()
                print(f"[trainer] the next step would end past the deadline: state saved "
                      f"at step {trainer.global_step}; rerun to resume")
                raise Preempted("deadline", trainer.global_step)
            t_step = time.monotonic()
            metrics = trainer.step()
            time.sleep(cfg.debug.sleep_per_step_s)
            clock.record_step(time.monotonic() - t_step)
            steps_this_process += 1
            trainer.log(metrics)
            _show_progress(bar, metrics, trainer.ref_schedule.held)

            # -- checkpoint
            stop = bool(cfg.debug.stop_after_steps
                        and steps_this_process >= cfg.debug.stop_after_steps)
            stop = stop or (until_step is not None and trainer.global_step >= until_step)
            # One reading of the flag decides this step's preemption, on all ranks together
            # (saving is a collective): a signal that lands later, even inside the save
            # below, is this decision's next step's, so "preempted, state saved" is never
            # said of a state that was not saved.
            received = flag.received
            preempted = distributed.any_rank(received is not None, world)
            saved_s = trainer.save(force_state=preempted or stop)
            if saved_s is not None:
                clock.record_save(saved_s)
            if trainer.global_step >= cfg.optim.steps:
                break
            if preempted:
                if world.main:
                    print(f"[trainer] preempted ({received or 'a peer rank'}) at step "
                          f"{trainer.global_step}, state saved, rerun to resume", flush=True)
                raise Preempted(received or "SIGTERM", trainer.global_step)
            if stop:
                return "KILLED"
    return "FINISHED"


def _show_progress(bar, metrics: dict, reference_held: bool) -> None:
    kl = metrics["kl_ref_k3"] if reference_held else metrics["kl_behav_k3"]
    bar.update(1)
    bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}", acc=f"{metrics['acc_mean']:.3f}",
                    kl="n/a" if kl is None else f"{kl:.2e}", refresh=False)
