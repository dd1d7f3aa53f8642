"""The RL loop for one grid cell: the Trainer recipe and the driver that runs its steps.

    python -m trainer --config run.yaml            # or: python -m trainer train --config ...
    from trainer.loop import train; train(cfg)     # -> the run directory

One step, as the paper's Algorithm 1 (`Trainer.step`, one call per stage):

    1. rollout + reward     trainer.collection: prompts -> n responses each (hf or vllm
                            engine) -> grader rewards (+ DAPO overlong shaping); dynamic
                            sampling drops all-equal groups and refills
    2. log-probs            trainer.update: behaviour log-probs pi_old recomputed by the
                            weights that sampled (no grad: the training model, or its lagged
                            copy under rollout.staleness), reference log-probs per schedule
    3. advantage            algorithms: group baselines (a KL in the reward first)
    4. update               trainer.update: K epochs of mini-batch optimizer steps with
                            `algorithms.compute_policy_loss`, micro-batched, clipped, guarded
    5. push + reference     the engine gets the new (or lagged) weights; the reference
                            schedule acts at the rollout boundary
    6. log, checkpoint      metrics.jsonl + MLflow; HF checkpoint and resume state when due
                            (trainer.state)

Set-up is trainer.setup (models, reference, lag, parallelism), state trainer.state (save,
resume, DONE). A run with a resume state continues from it; on CPU the resumed metrics equal
an uninterrupted run's exactly.

Legend: G groups (prompts) kept, n responses per prompt, B = G * n sequences, T response
length (padded).
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from algorithms import (
    CORRECTION_METRICS,
    LOSS_METRICS,
    compute_advantages,
    correct,
    kl_reward_penalty,
)
from common.files import write_atomic
from common.layout import RunDir
from trainer import async_rollout, distributed, lora, state
from trainer.checkpoint import Preempted, PreemptionFlag, stop_signals_ignored
from trainer.collection import Collector, PromptSampler, Rollout
from trainer.config import RunConfig, dump_run_config
from trainer.deadline import Deadline
from trainer.optimizers import build_optimizer
from trainer.rollout import logprob_gap, make_engine, sampler_logprobs
from trainer.runtime import autocast_dtype, resolve_device, torch_dtype, tune_cpu_runtime
from trainer.setup import build_models
from trainer.tasks import load_problems
from trainer.tracking import Tracker
from trainer.update import Updater, learning_rate, loss_batch


class Trainer:
    """One training run as a recipe (torchtune's lifecycle), composing its parts: the
    models (trainer.setup), the Collector (trainer.collection), the Updater
    (trainer.update), the engine, the reference schedule and the tracker:

        trainer = Trainer(cfg)       # the config, device and process group; nothing heavy
        trainer.setup()              # models, optimizer, the resume state, engine, tracker
        metrics = trainer.step()     # one RL step: rollout, log-probs, advantage, update
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
        self.counters = state.Counters()
        self.last_state_time = time.monotonic()
        self.tracker: Tracker | None = None

    @property
    def global_step(self) -> int:
        """The RL step: 0 before the first, the last one completed after `step()`."""
        return self.counters.step

    @global_step.setter
    def global_step(self, value: int) -> None:
        self.counters.step = value

    # -------------------------------------------------------------- setup

    def setup(self, *, track: bool = True) -> None:
        """Build every part, resume from the run's state if it has one, then (with `track`,
        rank 0) write the resolved config and open the tracker. `track=False` builds the
        parts only and writes nothing (tests and benchmarks that drive single steps)."""
        cfg = self.cfg
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.models = m = build_models(cfg, self.world, self.device, self.autocast)
        self.model, self.tokenizer, self.peft = m.model, m.tokenizer, m.peft
        self.policy, self.ref_policy, self.behaviour_policy = (m.policy, m.ref_policy,
                                                               m.behaviour_policy)
        self.ref_schedule, self.lag = m.ref_schedule, m.lag
        self.problems = load_problems(cfg.task, seed=cfg.seed)
        self.sampler = PromptSampler(len(self.problems), cfg.seed)
        self.optimizer = build_optimizer(lora.trainable(self.policy), cfg.optim)
        self.updater = Updater(cfg, self.world, self.device, self.autocast, self.policy,
                               self.optimizer, self.ref_schedule, self.counters)
        state.resume(self)
        if cfg.rollout.mode == "async":  # the engine in a process of its own
            self.engine = async_rollout.start(cfg, self.lag, pushes=self.global_step,
                                              world=self.world)
        else:
            self.engine = make_engine(cfg.rollout, m.sampling_model, self.tokenizer,
                                      model_path=cfg.model.path, seed=cfg.seed,
                                      compute_dtype=self.autocast, run_dir=self.run.root)
            if self.global_step > 0:
                self.engine.sync_weights(m.sampling_model)
        self.collector = Collector(cfg, self.world, self.device, m, self.problems,
                                   self.sampler, self.engine)
        time.sleep(cfg.debug.sleep_in_setup_s)
        if track and self.world.main:
            _drill(cfg.debug.fail_in_setup == "config", "the config could not be written")
            state.write_config(self.run.config, cfg, self.config_yaml,
                               resumed=self.global_step > 0)
            _drill(cfg.debug.fail_in_setup == "tracker", "the tracker could not start")
            self.tracker = Tracker(self.run.root, cfg.tracking, resume_step=self.global_step,
                                   run_name=cfg.run_id, tags=cfg.tags,
                                   params=cfg.model_dump(mode="json"),
                                   config_yaml=self.config_yaml)
        distributed.align(self.world, "rank 0's config and tracker")
        self.last_state_time = time.monotonic()

    @property
    def sampling_model(self):
        """The model whose weights the rollouts sample from: the trained one, or the lag's."""
        return self.models.sampling_model

    def sampling_step(self, pushes: int) -> int:
        """The step whose weights sample (and score) the next rollout after `pushes`
        updates: the last one, or under rollout.staleness the lag's."""
        return pushes if self.lag is None else self.lag.sampling_step(pushes)

    @property
    def overlapped(self) -> async_rollout.AsyncRollouts | None:
        """The rollout worker under rollout.mode async, else None."""
        engine = self.engine.engine
        return engine if isinstance(engine, async_rollout.AsyncRollouts) else None

    # -------------------------------------------------------------- one step

    def step(self) -> dict:
        """One RL step; returns its metrics (the line metrics.jsonl gets)."""
        self.global_step += 1
        t0 = time.perf_counter()
        if self.cfg.debug.fail_at == (self.world.rank, self.global_step):
            raise RuntimeError(f"debug.fail_at: rank {self.world.rank} fails at step "
                               f"{self.global_step}")
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.cfg.optim, self.global_step)

        # -- 1. rollout + reward (dynamic sampling refills inside), sampled by the weights
        # that score it; under rollout.mode async the worker then samples the next step
        # while this one updates
        scoring = self.sampling_step(self.global_step - 1)
        worker = self.overlapped
        if worker is not None:  # it samples with the scoring weights (sent if it lacks them)
            worker.ensure(scoring, lambda: self.lag.full_weights(keep=self.world.main))
            worker.sampled_steps.clear()
        rollout = self.collect()
        sampled = list(worker.sampled_steps) if worker is not None else [scoring]
        async_rollout.check_scored_by_sampler(sampled, scoring, self.global_step)
        if worker is not None and self.global_step < self.cfg.optim.steps:
            self.sample_ahead(self.global_step + 1)
        t_rollout = time.perf_counter() - t0
        metrics: dict = {"step": self.global_step, **rollout.stats,
                         "rollout_weights_step": min(sampled),
                         "rollout_staleness": self.global_step - 1 - min(sampled)}
        tokens = metrics.pop("response_tokens")
        learned: dict = dict.fromkeys((*LOSS_METRICS, *CORRECTION_METRICS, "grad_norm", "entropy"))
        times = {"time_logprob": 0.0, "time_update": 0.0}
        # -- 2-5. log-probs, advantage, update, push + reference (a non-empty rollout)
        if rollout.batch is not None:
            learned, times = self.learn(rollout, metrics)

        # -- 6. log (the driver logs and saves)
        t_step = time.perf_counter() - t0
        metrics.update(learned)
        metrics.update({
            "lr": self.optimizer.param_groups[0]["lr"],
            "nonfinite_skips": self.counters.nonfinite_skips,
            "ref_updates": self.ref_schedule.updates, "time_rollout": t_rollout, **times,
            "time_step": t_step, "tokens_per_sec": tokens / t_step if t_step > 0 else None,
        })
        return metrics

    def collect(self) -> Rollout:
        """Stage 1, this step's rollout + reward (trainer.collection)."""
        return self.collector.collect(self.global_step)

    def sample_ahead(self, step: int) -> None:
        """Ask the worker for step `step`'s first round now (every rank's share), with the
        weights that step samples with: the lag's next (theta_{max(step-1-k, 0)}), which
        exist already."""
        lag, r = self.lag, self.cfg.rollout
        self.overlapped.ensure(lag.next_sampling_step(self.global_step - 1),
                               lambda: lag.full_after_push(keep=self.world.main))
        self.overlapped.submit(self.collector.first_round(step), n=r.n,
                               temperature=r.temperature, top_p=r.top_p,
                               max_new_tokens=r.max_new_tokens)

    def learn(self, rollout: Rollout, metrics: dict) -> tuple[dict, dict]:
        """Stages 2-5 for a non-empty rollout: log-probs, advantages, the update, the push
        and the reference schedule; returns (loss metrics, timings) and adds the log-prob
        gap and the correction's metrics to `metrics`."""
        batch, up = rollout.batch, self.updater
        # -- 2. behaviour and reference log-probs (no grad; behaviour: the sampling weights)
        t1 = time.perf_counter()
        old_logp, entropy = up.logprobs_no_grad(self.behaviour_policy, batch, with_entropy=True)
        ref_logp = None
        if self.ref_schedule.held:
            with self.ref_schedule.applied(self.model):  # LoRA: the policy as the reference
                ref_logp = up.logprobs_no_grad(self.ref_policy, batch, False)[0]
        t_logprob = time.perf_counter() - t1
        mask = batch.response_mask
        # the sampler's log-probs mu (the engine's; pi_old itself with the hf engine)
        mu_logp = sampler_logprobs(rollout.engine_logprobs, old_logp)
        metrics.update(logprob_gap(mu_logp, old_logp, mask))
        c = self.cfg.rollout.correction
        fix = correct(old_logp, mu_logp, mask, c.mode, c.cap)  # its metrics; the loss applies it
        metrics.update(zip(fix.metrics, torch.stack(list(fix.metrics.values())).tolist()))

        # -- 3. advantage (a KL placed in the reward becomes a token penalty first)
        penalty = kl_reward_penalty(self.loss_cfg, old_logp,
                                    ref_logp if ref_logp is not None else old_logp, mask)
        advantages = compute_advantages(rollout.rewards, rollout.group_ids,
                                        self.method.advantage, mask=mask, token_penalty=penalty)

        # -- 4. update
        if self.cfg.debug.signal_in_update == self.global_step and self.world.main:
            os.kill(os.getpid(), signal.SIGTERM)  # the drill: a signal mid-step
        t2 = time.perf_counter()
        learned = up.update(loss_batch(batch, rollout.truncated, self.cfg.rollout.mask_truncated),
                            old_logp, ref_logp, advantages, mu_logp)
        learned["entropy"] = ((entropy * mask).sum() / mask.sum().clamp_min(1)).item()
        # -- 5. the weights the next rollout samples with, then the reference schedule
        self._push_weights()
        t_update = time.perf_counter() - t2
        kl_ref = learned.get(self.cfg.method.reference.kl_metric)
        self.ref_schedule.after_step(self.model, kl_ref if ref_logp is not None else None)
        return learned, {"time_logprob": t_logprob, "time_update": t_update}

    def _push_weights(self) -> None:
        """After the update: the engine gets the weights the next rollout samples with, the
        trained ones or, under rollout.staleness, the lag's (k pushes late; every step, as
        a level-2 vLLM sleep discards them)."""
        if self.lag is None:
            self.engine.sync_weights(self.model)
            return
        self.optimizer.zero_grad(set_to_none=True)  # as sync_weights does for self.model
        self.lag.push(self.model)
        if self.overlapped is None:  # the worker got these before the update (sample_ahead)
            self.engine.sync_weights(self.lag.model)

    # -------------------------------------------------------------- log, save, cleanup

    def log(self, metrics: dict) -> None:
        if self.tracker is not None:
            self.tracker.log(self.global_step, metrics)

    def save(self, *, force_state: bool = False) -> float | None:
        """What is due after a step (trainer.state.save_due): the seconds the resume state
        took, None when none was saved."""
        return state.save_due(self, force_state=force_state)

    def save_state(self) -> None:
        state.save_state(self)

    def cleanup(self, status: str) -> None:
        """End tracking with `status` (FINISHED, KILLED or FAILED); on FINISHED drop the
        resume state and write DONE last (trainer.state.finish)."""
        if self.tracker is not None:
            self.tracker.close(status)
        state.finish(self, status)

    def close(self) -> None:
        """End the engine and every process it started (the rollout worker, vLLM's): on
        every exit path, a set-up that failed half-way included."""
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.engine.close()


def _drill(when: bool, what: str) -> None:
    """debug.fail_in_setup: fail set-up here, as a real OSError would."""
    if when:
        raise OSError(f"debug.fail_in_setup: {what}")


# ---------------------------------------------------------------------------- entry point


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
    status = "FAILED"
    try:
        trainer.setup()  # may start the rollout worker, which must not outlive a failure
        status = _run_steps(trainer, Deadline(deadline, margin_s=cfg.checkpoint.deadline_margin_s),
                            until_step)
    except Preempted:
        status = "KILLED"
        raise
    finally:
        with stop_signals_ignored():  # the way out runs whole
            try:
                trainer.cleanup(status)
            finally:
                trainer.close()  # vLLM ends its groups while torchrun's still exists
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
            distributed.align(world, "rank 0's metrics and MLflow")
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
