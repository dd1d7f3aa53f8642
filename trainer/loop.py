"""The RL loop for one grid cell: rollout, reward, advantage, update, log, checkpoint.

    python -m trainer --config run.yaml            # or: python -m trainer train --config ...
    from trainer.loop import train; train(cfg)     # -> the run directory

Each step: draw prompts -> n responses each (hf or vllm engine) -> rewards from the
evaluation grader (+ DAPO overlong shaping; dynamic sampling drops all-equal groups and
refills) -> behaviour log-probs recomputed by the training model (no grad) -> reference
log-probs per the schedule (none for "rollout") -> advantages -> K epochs of mini-batch
AdamW updates with `algorithms.compute_policy_loss` (gradient accumulation over
micro-batches, clipping, a non-finite guard) -> reference schedule -> metrics.jsonl +
MLflow -> HF checkpoint if due, resume state if due. A run with a resume state continues
from it; on CPU the resumed metrics equal an uninterrupted run's exactly.

Legend: G groups (prompts) kept, n responses per prompt, B = G * n sequences, T response
length (padded), P prompt length (padded).
"""

from __future__ import annotations

import random
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from algorithms import compute_advantages, compute_policy_loss, kl_reward_penalty
from eval.files import write_atomic
from eval.prompts import build_prompt
from trainer.checkpoint import (
    Preempted,
    PreemptionFlag,
    checkpoint_dir,
    load_state,
    save_hf_checkpoint,
    save_state,
)
from trainer.config import RunConfig, dump_run_config
from trainer.logprobs import PackedBatch, pack, response_logprobs
from trainer.reference import Reference
from trainer.rollout import logprob_gap, make_engine
from trainer.runtime import autocast_dtype, resolve_device, torch_dtype, tune_cpu_runtime
from trainer.tasks import load_problems, score
from trainer.tracking import Tracker

LOSS_METRICS = ("loss", "pg_loss", "kl_loss", "is_weight_mean", "is_weight_max",
                "clip_frac_upper", "clip_frac_lower", "clip_frac_dual", "kl_ref_k1", "kl_ref_k3",
                "kl_behav_k1", "kl_behav_k3")
TIME_METRICS = ("time_rollout", "time_logprob", "time_update", "time_step", "tokens_per_sec")


class NonFiniteError(RuntimeError):
    """Too many non-finite updates in a row."""


# ---------------------------------------------------------------------------- setup helpers


def load_policy(model_cfg, device: torch.device):
    """Model (train mode, `dtype` weights) and tokenizer (pad token guaranteed)."""
    if not model_cfg.path:
        raise ValueError("model.path is required (an HF model directory or hub id; for the "
                         "tiny default build one with `python -m trainer tiny --out DIR`)")
    tokenizer = AutoTokenizer.from_pretrained(model_cfg.path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    kwargs = {"dtype": torch_dtype(model_cfg.dtype)}
    if model_cfg.attn_implementation:
        kwargs["attn_implementation"] = model_cfg.attn_implementation
    model = AutoModelForCausalLM.from_pretrained(model_cfg.path, **kwargs).to(device)
    if model_cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
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


@dataclass
class Rollout:
    """One step's training batch (kept groups) plus stats over everything generated."""

    batch: PackedBatch | None
    rewards: torch.Tensor  # (B,)
    group_ids: torch.Tensor  # (B,) long
    stats: dict = field(default_factory=dict)
    engine_logprobs: list | None = None  # per row: the engine's log-probs of its tokens


def _warmup_then_constant(warmup_steps: int):
    return lambda i: min(1.0, (i + 1) / warmup_steps) if warmup_steps > 0 else 1.0


# ---------------------------------------------------------------------------- the trainer


class Trainer:
    """A recipe: setup, step, save, cleanup. Composes the engine, reference, tracker."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.out = Path(cfg.out_dir)
        self.method = cfg.resolved_method()
        self.loss_cfg = self.method.loss
        self.device = resolve_device(cfg.model.device)
        self.autocast = autocast_dtype(cfg.model.compute_dtype, self.device)
        self.config_yaml = dump_run_config(cfg)

        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.model, self.tokenizer = load_policy(cfg.model, self.device)
        self.problems = load_problems(cfg.task, seed=cfg.seed)
        self.add_special = not getattr(self.tokenizer, "chat_template", None)
        self.sampler = PromptSampler(len(self.problems), cfg.seed)
        # Built from the initial weights, before any resume state is loaded: a "fixed"
        # reference is the initial policy.
        ref = cfg.method.reference
        self.reference = Reference(self.method.reference, self.model, k=ref.k, kappa=ref.kappa,
                                   kl_ema=ref.kl_ema)
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=o.lr, betas=o.betas,
                                           weight_decay=o.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, _warmup_then_constant(o.warmup_steps))
        self.step = 0
        self.nonfinite_skips = 0
        self.nonfinite_in_row = 0
        self.last_checkpoint: Path | None = None
        self._resume()
        self.engine = make_engine(cfg.rollout, self.model, self.tokenizer,
                                  model_path=cfg.model.path, seed=cfg.seed,
                                  compute_dtype=self.autocast)
        if self.step > 0:
            self.engine.sync_weights(self.model)

    # -------------------------------------------------------------- resume

    def _resume(self) -> None:
        state = load_state(self.out)
        if state is None:
            return
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        self.reference.load_state_dict(state["reference"])
        self.step = state["step"]
        self.nonfinite_skips = state["nonfinite_skips"]
        self.nonfinite_in_row = state["nonfinite_in_row"]
        last = state.get("last_checkpoint")
        self.last_checkpoint = Path(last) if last else None
        # Checkpoint wins for: weights, optimizer, scheduler, RNG, data position, reference,
        # counters. The config wins for everything else (steps, checkpoints, tracking, ...).
        print(f"[trainer] resuming {self.out} at step {self.step}: weights, optimizer, LR "
              "schedule, RNG, data position and reference from the state; all settings from "
              "the config")

    def state_payload(self) -> dict:
        return {
            "step": self.step, "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(), "reference": self.reference.state_dict(),
            "nonfinite_skips": self.nonfinite_skips, "nonfinite_in_row": self.nonfinite_in_row,
            "last_checkpoint": str(self.last_checkpoint) if self.last_checkpoint else None,
        }

    # -------------------------------------------------------------- one step

    def collect(self) -> Rollout:
        """Rollout + reward (+ dynamic sampling). Stats cover every generated response."""
        r, t = self.cfg.rollout, self.cfg.task
        dynamic = self.method.dynamic_sampling
        kept: list[tuple[list[int], list, list[float]]] = []  # per group
        all_rewards, all_correct, lengths, truncated = [], [], [], []
        gen_batches = dropped = 0
        while True:
            idx = self.sampler.take(r.prompts_per_step)
            problems = [self.problems[i] for i in idx]
            texts = [build_prompt(p["problem"], t.template, self.tokenizer) for p in problems]
            samples = self.engine.generate(
                texts, n=r.n, seed=generation_seed(self.cfg.seed, self.step, gen_batches))
            gen_batches += 1
            flat = [s for group in samples for s in group]
            golds = [p["answer"] for p in problems for _ in range(r.n)]
            rewards, correct = score([s.text for s in flat], golds, t)
            if self.method.overlong_shaping:
                rewards = [rw + overlong_penalty(len(s.token_ids), r.max_new_tokens,
                                                 r.overlong_buffer, r.overlong_penalty)
                           for rw, s in zip(rewards, flat)]
            all_rewards += rewards
            all_correct += correct
            lengths += [len(s.token_ids) for s in flat]
            truncated += [s.finish_reason == "length" for s in flat]
            for g, text in enumerate(texts):
                group_rewards = rewards[g * r.n : (g + 1) * r.n]
                if dynamic and max(group_rewards) == min(group_rewards):
                    dropped += 1
                    continue
                prompt_ids = self.tokenizer(text, add_special_tokens=self.add_special)["input_ids"]
                kept.append((prompt_ids, samples[g], group_rewards))
            if not dynamic or len(kept) >= r.prompts_per_step or gen_batches >= r.max_gen_batches:
                break
        # Extra groups from the last refill are generated but not trained on (DAPO does the same).
        groups_kept = min(len(kept), r.prompts_per_step)
        dropped += len(kept) - groups_kept
        kept = kept[:groups_kept]
        rw = torch.tensor(all_rewards, dtype=torch.float32)
        stats = {
            "reward_mean": rw.mean().item(), "reward_std": rw.std(unbiased=False).item(),
            "acc_mean": float(np.mean(all_correct)),
            "response_length_mean": float(np.mean(lengths)),
            "response_length_max": int(max(lengths)),
            "truncated_frac": float(np.mean(truncated)),
            "groups_kept": groups_kept, "groups_dropped": dropped, "gen_batches": gen_batches,
            "response_tokens": int(sum(lengths)),
        }
        if not kept:
            empty = torch.zeros(0)
            return Rollout(None, empty, empty.long(), stats)
        prompts = [p for p, group, _ in kept for _ in group]
        responses = [s.token_ids for _, group, _ in kept for s in group]
        batch = pack(prompts, responses, self.tokenizer.pad_token_id).to(self.device)
        rewards = torch.tensor([x for _, _, g in kept for x in g], device=self.device)
        group_ids = torch.arange(len(kept), device=self.device).repeat_interleave(self.cfg.rollout.n)
        return Rollout(batch, rewards, group_ids, stats,
                       [s.logprobs for _, group, _ in kept for s in group])

    def _micro_slices(self, rows: torch.Tensor) -> list[torch.Tensor]:
        m = self.cfg.optim.micro_batch_size
        return [rows[i : i + m] for i in range(0, len(rows), m)]

    @torch.no_grad()
    def logprobs_no_grad(self, model, batch: PackedBatch, with_entropy: bool):
        """(B, T) log-probs (and entropies) of `model`, micro-batched, no autograd."""
        was_training = model.training
        model.eval()
        logps, ents = [], []
        for rows in self._micro_slices(torch.arange(batch.input_ids.shape[0])):
            lp, ent = response_logprobs(model, batch.rows(rows), with_entropy=with_entropy,
                                        temperature=self.cfg.rollout.temperature,
                                        autocast=self.autocast)
            logps.append(lp)
            ents.append(ent)
        model.train(was_training)
        return torch.cat(logps), torch.cat(ents)

    def update(self, batch: PackedBatch, old_logp, ref_logp, advantages) -> dict:
        """K epochs of mini-batch AdamW steps; returns averaged loss metrics + grad norm."""
        o = self.cfg.optim
        B = batch.input_ids.shape[0]
        mini = o.mini_batch_size or B
        token_mean = self.loss_cfg.agg == "token-mean"
        sums: dict[str, torch.Tensor] = {}
        grad_norms, n_mini = [], 0
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.model.train()
        for epoch in range(o.epochs):
            if mini < B:
                gen = torch.Generator().manual_seed(generation_seed(self.cfg.seed, self.step, epoch))
                order = torch.randperm(B, generator=gen).to(self.device)
            else:
                order = torch.arange(B, device=self.device)
            for start in range(0, B, mini):
                rows = order[start : start + mini]
                mini_tokens = batch.response_mask[rows].sum().clamp_min(1.0)
                self.optimizer.zero_grad(set_to_none=True)
                total_loss = torch.zeros((), device=self.device)
                for micro in self._micro_slices(rows):
                    mb = batch.rows(micro)
                    logp, _ = response_logprobs(self.model, mb, autocast=self.autocast,
                                                temperature=self.cfg.rollout.temperature)
                    loss, metrics = compute_policy_loss(
                        self.loss_cfg, logp, old_logp[micro],
                        None if ref_logp is None else ref_logp[micro], advantages[micro],
                        mb.response_mask, norm_len=self.cfg.rollout.max_new_tokens,
                    )
                    # Re-weight so the micro-batch losses sum to the mini-batch aggregate.
                    w = (mb.response_mask.sum() / mini_tokens if token_mean
                         else torch.tensor(len(micro) / len(rows), device=self.device))
                    if self.step in self.cfg.debug.nonfinite_steps:
                        loss = loss * float("nan")
                    (loss * w).backward()
                    total_loss = total_loss + loss.detach() * w
                    for k in LOSS_METRICS:
                        sums[k] = sums.get(k, 0.0) + metrics[k].detach() * w
                clip = o.grad_clip if o.grad_clip is not None else float("inf")
                grad_norm = torch.nn.utils.clip_grad_norm_(params, clip)
                # One host sync per optimizer step: needed to decide whether to skip it.
                finite = bool(torch.isfinite(total_loss) & torch.isfinite(grad_norm))
                n_mini += 1
                if finite:
                    self.optimizer.step()
                    self.nonfinite_in_row = 0
                    grad_norms.append(grad_norm.item())
                    self.reference.after_optimizer_step(self.model)
                else:
                    self.optimizer.zero_grad(set_to_none=True)
                    self.nonfinite_skips += 1
                    self.nonfinite_in_row += 1
                    if self.nonfinite_in_row >= o.max_nonfinite_in_row:
                        raise NonFiniteError(
                            f"step {self.step}: {self.nonfinite_in_row} non-finite losses or "
                            f"gradients in a row (optim.max_nonfinite_in_row="
                            f"{o.max_nonfinite_in_row}); last good checkpoint: "
                            f"{self.last_checkpoint or 'none (no checkpoint saved yet)'}")
                self.scheduler.step()
        out = {k: (v / n_mini).item() for k, v in sums.items()}
        out["grad_norm"] = float(np.mean(grad_norms)) if grad_norms else None
        return out

    def run_step(self) -> dict:
        self.step += 1
        t0 = time.perf_counter()

        # -- rollout + reward (dynamic sampling refills inside)
        rollout = self.collect()
        t_rollout = time.perf_counter() - t0
        metrics: dict = {"step": self.step, **rollout.stats}
        tokens = metrics.pop("response_tokens")
        loss_metrics: dict = dict.fromkeys((*LOSS_METRICS, "grad_norm", "entropy"))
        t_logprob = t_update = 0.0
        if rollout.batch is not None:
            batch = rollout.batch
            # -- behaviour and reference log-probs (training model, no grad)
            t1 = time.perf_counter()
            old_logp, entropy = self.logprobs_no_grad(self.model, batch, with_entropy=True)
            ref_logp = (self.logprobs_no_grad(self.reference.model, batch, False)[0]
                        if self.reference.held else None)
            t_logprob = time.perf_counter() - t1
            mask = batch.response_mask
            metrics.update(logprob_gap(rollout.engine_logprobs, old_logp, mask))

            # -- advantage (a KL placed in the reward becomes a token penalty first)
            penalty = kl_reward_penalty(self.loss_cfg, old_logp,
                                        ref_logp if ref_logp is not None else old_logp, mask)
            advantages = compute_advantages(rollout.rewards, rollout.group_ids,
                                            self.method.advantage, mask=mask,
                                            token_penalty=penalty)

            # -- update
            t2 = time.perf_counter()
            loss_metrics = self.update(batch, old_logp, ref_logp, advantages)
            loss_metrics["entropy"] = ((entropy * mask).sum() / mask.sum().clamp_min(1)).item()
            self.engine.sync_weights(self.model)
            t_update = time.perf_counter() - t2
            kl_ref = loss_metrics.get(self.cfg.method.reference.kl_metric)
            self.reference.after_step(self.model, kl_ref if ref_logp is not None else None)

        # -- log
        t_step = time.perf_counter() - t0
        metrics.update(loss_metrics)
        metrics.update({
            "lr": self.scheduler.get_last_lr()[0], "nonfinite_skips": self.nonfinite_skips,
            "ref_updates": self.reference.updates, "time_rollout": t_rollout,
            "time_logprob": t_logprob, "time_update": t_update, "time_step": t_step,
            "tokens_per_sec": tokens / t_step if t_step > 0 else None,
        })
        return metrics


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


def _write_config(out: Path, cfg: RunConfig, config_yaml: str) -> None:
    import yaml

    path = out / "config.yaml"
    if path.exists():
        changed = _changed_keys(yaml.safe_load(path.read_text()) or {},
                                cfg.model_dump(mode="json"))
        if changed:
            warnings.warn(f"{path}: the config differs from the saved one in {changed}; "
                          "the new config wins (the saved state still sets weights, optimizer, "
                          "RNG and data position)", stacklevel=3)
    write_atomic(path, config_yaml)


def train(cfg: RunConfig) -> Path:
    """Run (or resume) one training run; returns the run directory. See the module doc."""
    out = Path(cfg.out_dir)
    if (out / "DONE").exists():
        print(f"[trainer] {out} is already DONE; nothing to do")
        return out
    out.mkdir(parents=True, exist_ok=True)
    tune_cpu_runtime()
    trainer = Trainer(cfg)
    _write_config(out, cfg, trainer.config_yaml)
    ck = cfg.checkpoint
    save_dtype = None if ck.save_dtype == "same" else torch_dtype(ck.save_dtype)
    tracker = Tracker(out, cfg.tracking, resume_step=trainer.step, run_name=cfg.run_id,
                      tags=cfg.tags, params=cfg.model_dump(mode="json"),
                      config_yaml=trainer.config_yaml)
    status = "FAILED"
    try:
        last_state_time = time.monotonic()
        steps_this_process = 0
        with PreemptionFlag() as flag:
            bar = tqdm(total=cfg.optim.steps, initial=trainer.step, desc=cfg.run_id,
                       disable=not cfg.tracking.progress, unit="step")
            while trainer.step < cfg.optim.steps:
                metrics = trainer.run_step()
                steps_this_process += 1
                tracker.log(trainer.step, metrics)
                kl = metrics["kl_ref_k3"] if trainer.reference.held else metrics["kl_behav_k3"]
                bar.update(1)
                bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}",
                                acc=f"{metrics['acc_mean']:.3f}",
                                kl="n/a" if kl is None else f"{kl:.2e}", refresh=False)

                # -- checkpoint
                if trainer.step in ck.eval_steps or trainer.step == cfg.optim.steps:
                    trainer.last_checkpoint = save_hf_checkpoint(
                        trainer.model, trainer.tokenizer, checkpoint_dir(out, trainer.step),
                        config_yaml=trainer.config_yaml, dtype=save_dtype)
                stop = cfg.debug.stop_after_steps and steps_this_process >= cfg.debug.stop_after_steps
                due = (
                    (ck.state_every_steps and trainer.step % ck.state_every_steps == 0)
                    or (ck.wall_clock_minutes is not None
                        and time.monotonic() - last_state_time > 60 * ck.wall_clock_minutes)
                    or flag.received or stop
                )
                if due and trainer.step < cfg.optim.steps:
                    save_state(out, trainer.state_payload())
                    last_state_time = time.monotonic()
                if flag.received and trainer.step < cfg.optim.steps:
                    status = "KILLED"
                    raise Preempted(flag.received, trainer.step)
                if stop and trainer.step < cfg.optim.steps:
                    status = "KILLED"
                    bar.close()
                    return out
            bar.close()
        status = "FINISHED"
    finally:
        tracker.close(status)
    # -- done: the final checkpoint and metrics are on disk; DONE goes last.
    if ck.keep_state:
        save_state(out, trainer.state_payload())
    else:
        (out / "state" / "resume.pt").unlink(missing_ok=True)
    (out / "DONE").write_text(f"step {trainer.step}\n")
    return out

