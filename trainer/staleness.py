"""Stale rollouts (`rollout.staleness: k`): the sampler lags the trained policy by k pushes.

Step t trains from theta_{t-1}, the weights after step t-1 (theta_0: the initial ones).
With staleness k its batch is sampled by theta_{max(t-1-k, 0)}, the weights step t-k
started from: the policy that would have sampled step t-k's batch on-policy. k = 0 is
today's on-policy loop; the first k+1 steps all sample from the initial weights (there are
no older ones). The behaviour log-probs (pi_old) are recomputed by the same stale weights.

    lag = WeightLag(model, k)        # a generation copy of the model, at theta_0
    ...step t's update...
    due = lag.push(model)            # queue theta_t; theta_{t-k} goes into lag.model
    engine.sync_weights(lag.model)   # vllm: push the lagged weights; hf samples lag.model

The queue holds at most k snapshots (state dicts on the CPU, so GPU memory pays for one
copy of the model only); it and the generation copy are part of the resume state
(`state_dict` / `load_state_dict`). `push` returns what became due, the weights a
generator on another device would be sent: the same code path serves a later overlap of
generation with training (docs/trainer.md "Stale rollouts").
"""

from __future__ import annotations

import copy
from collections import deque

import torch


def cpu_snapshot(model) -> dict[str, torch.Tensor]:
    """A copy of every state-dict entry on the CPU (a clone even when already there)."""
    return {name: t.detach().to("cpu", copy=True) for name, t in model.state_dict().items()}


def check_world(staleness: int, distributed: bool) -> None:
    """Staleness keeps a full, unsharded generation copy and CPU snapshots: one process
    only for now (the FSDP2 resume state would need the lag sharded too)."""
    if staleness and distributed:
        raise ValueError(f"rollout.staleness={staleness} is not supported under FSDP2 "
                         "(torchrun with several ranks) yet: set rollout.staleness: 0 or "
                         "train on one process (resources.train.gpus <= 1)")


class WeightLag:
    """A generation copy of the model that lags the trained one by `k` weight pushes."""

    def __init__(self, model, k: int) -> None:
        if k < 1:
            raise ValueError(f"rollout.staleness={k}: a lag needs k >= 1 (k = 0 needs none)")
        self.k = k
        self.model = copy.deepcopy(model).requires_grad_(False)  # theta_0 until k pushes wait
        self.pending: deque[dict[str, torch.Tensor]] = deque()  # oldest first, at most k

    def push(self, trained) -> dict[str, torch.Tensor] | None:
        """After step t's update: queue theta_t; once more than k wait, the oldest,
        theta_{t-k}, is loaded into the generation copy and returned (None: the copy keeps
        the initial weights, during the first k pushes)."""
        self.pending.append(cpu_snapshot(trained))
        if len(self.pending) <= self.k:
            return None
        due = self.pending.popleft()
        self.model.load_state_dict(due)
        return due

    def sampling_step(self, pushes: int) -> int:
        """The step whose weights the generation copy holds after `pushes` pushes (0: the
        initial ones): theta_{max(pushes - k, 0)}, as the snapshots waiting say."""
        return pushes - len(self.pending)

    def next_due(self) -> dict[str, torch.Tensor] | None:
        """What the generation copy will hold after the next push: the oldest waiting
        snapshot once k wait, else None (it keeps its weights). An overlapped worker
        (trainer.async_rollout) samples the next step with these before that push."""
        return self.pending[0] if len(self.pending) == self.k else None

    # -------------------------------------------------------------- resume

    def counters(self) -> dict:
        """The resume state's small part: k and how many snapshots wait."""
        return {"k": self.k, "pending": len(self.pending)}

    def state_dict(self) -> dict:
        """The generation copy's weights and the waiting snapshots, as plain CPU tensors."""
        return {"generator": cpu_snapshot(self.model),
                "pending": {str(i): s for i, s in enumerate(self.pending)}}

    def templates(self, pending: int) -> dict:
        """Tensors shaped like a saved `state_dict` with `pending` snapshots, to load into."""
        return {"generator": cpu_snapshot(self.model),
                "pending": {str(i): cpu_snapshot(self.model) for i in range(pending)}}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["generator"])
        self.pending = deque(state["pending"][str(i)] for i in range(len(state["pending"])))


def check_resume(saved: dict | None, staleness: int) -> None:
    """A resume state keeps the lag it was saved with: another k would need weights it
    does not hold (saved counters: `WeightLag.counters`, None for k = 0)."""
    saved_k = saved["k"] if saved else 0
    if saved_k != staleness:
        raise ValueError(f"rollout.staleness={staleness} but the resume state was saved with "
                         f"staleness {saved_k}: set rollout.staleness: {saved_k} to resume, or "
                         "delete the run's state/ to start over")
