"""State: what a run saves, resumes from, and leaves behind; preemption's contract with it.

    counters = Counters()                   # step, non-finite skips, last checkpoint
    resume(trainer)                         # weights, optimizer, RNG, data, reference, lag
    save_due(trainer, force_state=...)      # HF checkpoint when due, resume state when due
    finish(trainer, status)                 # on success: state removed, DONE written last

The resume state is sharded (`torch.distributed.checkpoint`): every rank writes its own
shards of the weights and optimizer states, rank 0 the small part (counters, data position,
the reference's schedule); it resumes at any world size. On resume the checkpoint wins for
weights, optimizer, RNG, data position, reference and counters; the config wins for every
setting. Saving is a collective under FSDP2, so every rank calls these together; rank 0
alone writes files. `trainer.loop` raises Preempted (exit 75) only after the state of that
step is saved.
"""

from __future__ import annotations

import os
import signal
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from common.files import read_yaml, write_atomic
from trainer import distributed, lora
from trainer.checkpoint import (
    load_sharded_state,
    load_state,
    remove_state,
    save_hf_checkpoint,
    save_sharded_state,
)
from trainer.config import RunConfig
from trainer.optimizers import evaluation_weights
from trainer.staleness import check_resume

if TYPE_CHECKING:
    from trainer.loop import Trainer


@dataclass
class Counters:
    """The run's counters, saved in the resume state: the RL step (1-based once a step
    started), non-finite updates skipped (in all, and in a row now) and the last HF
    checkpoint written (a NonFiniteError names it)."""

    step: int = 0
    nonfinite_skips: int = 0
    nonfinite_in_row: int = 0
    last_checkpoint: Path | None = None


def sharded_state(t: Trainer, reference: bool, lag_pending: int | None = None) -> dict:
    """This rank's shards of the weights and optimizer (and the reference's weights, and
    under staleness the lag's copy and snapshots, one process only): what the resume state
    saves, and (with the saved `lag_pending` count) the templates it loads into."""
    tensors = {"model": distributed.sharded_model_state(t.policy),
               "optimizer": distributed.sharded_optimizer_state(t.policy, t.optimizer)}
    if reference:
        tensors["reference"] = (
            t.ref_schedule.adapters or lora.adapter_snapshot(t.model)
            if t.ref_schedule.lora else distributed.sharded_model_state(t.ref_policy))
    if t.lag is not None:
        tensors["staleness"] = (t.lag.state_dict() if lag_pending is None
                                else t.lag.templates(lag_pending))
    return tensors


def state_payload(t: Trainer) -> dict:
    """The resume state's small part (rank 0 writes it): counters, data position, the
    reference's schedule, and whether the reference's weights are saved too."""
    c = t.counters
    payload = {
        "step": c.step, "sampler": t.sampler.state_dict(),
        "reference": t.ref_schedule.counters(),
        "nonfinite_skips": c.nonfinite_skips, "nonfinite_in_row": c.nonfinite_in_row,
        "last_checkpoint": str(c.last_checkpoint) if c.last_checkpoint else None,
    }
    if t.ref_schedule.refreshed:
        payload["reference_weights"] = True  # its weights are saved sharded too
    if t.lag is not None:
        payload["staleness"] = t.lag.counters()  # its tensors are saved with the rest
    return payload


def save_state(t: Trainer) -> None:
    """The resume state, sharded (see module doc; a collective under FSDP2)."""
    payload = state_payload(t)
    tensors = sharded_state(t, reference="reference_weights" in payload)
    save_sharded_state(t.run.root, payload, tensors, step=t.counters.step, main=t.world.main,
                       barrier=lambda: distributed.barrier(t.world, "the resume state"))


def resume(t: Trainer) -> None:
    """Load the run's resume state into the trainer's parts, if it has one."""
    state = load_state(t.run.root)
    if state is None:
        return
    check_resume(state.get("staleness"), t.cfg.rollout.staleness)
    templates = sharded_state(t, reference="reference_weights" in state,
                              lag_pending=(state.get("staleness") or {}).get("pending"))
    load_sharded_state(t.run.root, state, templates)
    distributed.set_sharded_state(t.policy, templates["model"], t.optimizer,
                                  templates["optimizer"])
    if "reference" in templates:
        if t.ref_schedule.lora:  # the refreshed adapters, loaded into their template
            t.ref_schedule.adapters = templates["reference"]
        else:
            distributed.set_sharded_state(t.ref_policy, templates["reference"])
    if t.lag is not None:
        t.lag.load_state_dict(templates["staleness"])
    t.sampler.load_state_dict(state["sampler"])
    t.ref_schedule.load_state_dict(state["reference"])
    last = state.get("last_checkpoint")
    t.counters.step = state["step"]
    t.counters.nonfinite_skips = state["nonfinite_skips"]
    t.counters.nonfinite_in_row = state["nonfinite_in_row"]
    t.counters.last_checkpoint = Path(last) if last else None
    # Checkpoint wins for: weights, optimizer, RNG, data position, reference,
    # counters. The config wins for everything else (steps, checkpoints, tracking, ...).
    print(f"[trainer] resuming {t.run} at step {t.counters.step}: weights, optimizer, "
          "RNG, data position, reference and lagged weights from the state; all settings "
          "from the config")


def save_checkpoint(t: Trainer, path: Path, dtype: torch.dtype | None) -> Path:
    """An HF checkpoint of the policy, holding the weights evaluation should see
    (schedule-free: x, trainer.optimizers); under FSDP2 the full weights are gathered first
    (a collective) and rank 0 writes. LoRA: the merged weights under the plain HF names
    (evaluation needs no peft), the adapters beside them in `adapter/`."""
    state, extra = None, None
    with evaluation_weights(t.optimizer):
        if t.peft is not None:  # LoRA: merged weights + the adapters (collectives)
            state, adapters = lora.checkpoint_parts(t.model, keep=t.world.main, dtype=dtype)
            extra = lora.adapter_writer(t.peft, adapters)
        elif t.world.distributed:
            prefix = "model."  # PolicyLogProbs wraps the HF model as `model`
            state = {k.removeprefix(prefix): v
                     for k, v in distributed.model_state(t.policy).items()}
        if t.world.main:
            if t.cfg.debug.signal_in_checkpoint == t.counters.step:
                os.kill(os.getpid(), signal.SIGTERM)  # the drill: a signal mid-save
            save_hf_checkpoint(t.model, t.tokenizer, path, config_yaml=t.config_yaml,
                               dtype=dtype, state_dict=state, extra=extra)
    distributed.align(t.world, f"rank 0's checkpoint {path.name}")
    return path


def save_due(t: Trainer, *, force_state: bool = False) -> float | None:
    """What is due after a step: the HF checkpoint at an eval step and at the last step;
    the resume state every `state_every_steps`, after `wall_clock_minutes`, or when
    `force_state` on any rank (a signal may reach one rank only; saving is a collective,
    so all ranks decide together). No state after the last step (`finish` decides).
    Returns the seconds the state save took, None when there was none."""
    ck, steps, c = t.cfg.checkpoint, t.cfg.optim.steps, t.counters
    if c.step in ck.eval_steps or c.step == steps:
        c.last_checkpoint = save_checkpoint(t, t.run.checkpoint(c.step), t.save_dtype)
    due = (
        (ck.state_every_steps and c.step % ck.state_every_steps == 0)
        or (ck.wall_clock_minutes is not None
            and time.monotonic() - t.last_state_time > 60 * ck.wall_clock_minutes)
        or force_state
    )
    if not distributed.any_rank(bool(due), t.world) or c.step >= steps:
        return None
    t_save = time.monotonic()
    save_state(t)
    t.last_state_time = time.monotonic()
    return t.last_state_time - t_save


def finish(t: Trainer, status: str) -> None:
    """On FINISHED the final checkpoint and metrics are on disk: drop the resume state
    (unless `checkpoint.keep_state`) and write DONE last. Any other status keeps it all."""
    if status != "FINISHED":
        return
    if t.cfg.checkpoint.keep_state:
        save_state(t)
    elif t.world.main:
        remove_state(t.run.root)
    if t.world.main:
        state_dir = t.run.state_dir
        if state_dir.is_dir() and not any(state_dir.iterdir()):
            state_dir.rmdir()  # an empty state/ would suggest something to resume
        t.run.done.write_text(f"step {t.counters.step}\n")


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


def write_config(path: Path, cfg: RunConfig, config_yaml: str, *, resumed: bool) -> None:
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
