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
generator on another device would be sent: the same code path serves the overlap of
generation with training (trainer.async_rollout, docs/trainer.md "Stale rollouts").

Under FSDP2 (several ranks) the generation copy is sharded like the policy (its shards
filled from rank 0's weights at set-up, as the reference's are) and each rank queues only
its own shards: a snapshot is a rank's slice, a push copies slices into slices, and the
resume state saves them as DTensors so DCP can reshard them. `full_weights` and
`full_next_due` gather whole tensors (a collective) for a worker that samples elsewhere.
"""

from __future__ import annotations

import copy
from collections import deque

import torch
from torch.distributed.tensor import DTensor

from trainer.distributed import meta_twin


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a state-dict entry: its shard of a DTensor, else the tensor."""
    return t.to_local() if isinstance(t, DTensor) else t


def cpu_snapshot(model) -> dict[str, torch.Tensor]:
    """A copy of every state-dict entry on the CPU (a clone even when already there); under
    FSDP2 this rank's shards only."""
    return {name: local(t).detach().to("cpu", copy=True)
            for name, t in model.state_dict().items()}


def as_saved(snapshot: dict[str, torch.Tensor], like: dict[str, torch.Tensor]) -> dict:
    """A snapshot as DCP saves it: a rank's slices as DTensors shaped like the state dict
    `like` (moved to its device while saved), plain tensors on one process."""
    out = {}
    for name, t in snapshot.items():
        spec = like[name]
        out[name] = (DTensor.from_local(t.to(spec.device), spec.device_mesh, spec.placements,
                                        run_check=False, shape=spec.shape, stride=spec.stride())
                     if isinstance(spec, DTensor) else t)
    return out


def gathered(snapshot: dict[str, torch.Tensor], like: dict[str, torch.Tensor], *,
             keep: bool = True) -> dict:
    """Whole CPU tensors from every rank's slices (a collective, one tensor at a time: every
    rank calls it; only where `keep`, rank 0's, are they kept: {} elsewhere)."""
    out = {}
    for name, t in as_saved(snapshot, like).items():
        whole = t.full_tensor() if isinstance(t, DTensor) else t
        if keep:
            out[name] = whole.cpu()
    return out


class WeightLag:
    """A generation copy of the model that lags the trained one by `k` weight pushes."""

    def __init__(self, model, k: int, *, empty: bool = False) -> None:
        """`empty`: a meta-device twin (no storage) whose FSDP2 shards set-up fills from
        rank 0 (trainer.setup), as for the reference."""
        if k < 1:
            raise ValueError(f"rollout.staleness={k}: a lag needs k >= 1 (k = 0 needs none)")
        self.k = k
        twin = meta_twin(model) if empty else copy.deepcopy(model)
        self.model = twin.requires_grad_(False)  # theta_0 until k pushes wait
        self.pending: deque[dict[str, torch.Tensor]] = deque()  # oldest first, at most k

    def push(self, trained) -> dict[str, torch.Tensor] | None:
        """After step t's update: queue theta_t; once more than k wait, the oldest,
        theta_{t-k}, is loaded into the generation copy and returned (None: the copy keeps
        the initial weights, during the first k pushes)."""
        self.pending.append(cpu_snapshot(trained))
        if len(self.pending) <= self.k:
            return None
        due = self.pending.popleft()
        self._load(due)
        return due

    @torch.no_grad()
    def _load(self, snapshot: dict[str, torch.Tensor]) -> None:
        """Copy a snapshot (this rank's slices under FSDP2) into the generation copy."""
        for name, t in self.model.state_dict().items():
            local(t).copy_(snapshot[name])

    def sampling_step(self, pushes: int) -> int:
        """The step whose weights the generation copy holds after `pushes` pushes (0: the
        initial ones): theta_{max(pushes - k, 0)}, as the snapshots waiting say."""
        return pushes - len(self.pending)

    def next_due(self) -> dict[str, torch.Tensor] | None:
        """What the generation copy will hold after the next push: the oldest waiting
        snapshot once k wait, else None (it keeps its weights). An overlapped worker
        (trainer.async_rollout) samples the next step with these before that push."""
        return self.pending[0] if len(self.pending) == self.k else None

    def next_sampling_step(self, pushes: int) -> int:
        """`sampling_step` after one more push (what `next_due` will make it)."""
        return self.sampling_step(pushes) + (self.next_due() is not None)

    def full_weights(self, *, keep: bool = True) -> dict[str, torch.Tensor]:
        """The generation copy's whole weights on the CPU (a collective under FSDP2: every
        rank calls it, those with `keep` get them)."""
        return gathered(cpu_snapshot(self.model), self.model.state_dict(), keep=keep)

    def full_after_push(self, *, keep: bool = True) -> dict[str, torch.Tensor]:
        """The whole weights the generation copy will hold after the next push (`next_due`
        once k wait, else its own), as `full_weights`."""
        due = self.next_due()
        if due is None:
            return self.full_weights(keep=keep)
        return gathered(due, self.model.state_dict(), keep=keep)

    # -------------------------------------------------------------- resume

    def counters(self) -> dict:
        """The resume state's small part: k and how many snapshots wait."""
        return {"k": self.k, "pending": len(self.pending)}

    def state_dict(self) -> dict:
        """The generation copy's weights and the waiting snapshots (DTensors under FSDP2)."""
        like = self.model.state_dict()
        return {"generator": as_saved(cpu_snapshot(self.model), like),
                "pending": {str(i): as_saved(s, like) for i, s in enumerate(self.pending)}}

    def templates(self, pending: int) -> dict:
        """Tensors shaped like a saved `state_dict` with `pending` snapshots, to load into."""
        like = self.model.state_dict()
        return {"generator": as_saved(cpu_snapshot(self.model), like),
                "pending": {str(i): as_saved(cpu_snapshot(self.model), like)
                            for i in range(pending)}}

    def load_state_dict(self, state: dict) -> None:
        def slices(saved: dict) -> dict:
            return {name: local(t).to("cpu", copy=True) for name, t in saved.items()}

        self._load(slices(state["generator"]))
        self.pending = deque(slices(state["pending"][str(i)])
                             for i in range(len(state["pending"])))


def check_resume(saved: dict | None, staleness: int) -> None:
    """A resume state keeps the lag it was saved with: another k would need weights it
    does not hold (saved counters: `WeightLag.counters`, None for k = 0)."""
    saved_k = saved["k"] if saved else 0
    if saved_k != staleness:
        raise ValueError(f"rollout.staleness={staleness} but the resume state was saved with "
                         f"staleness {saved_k}: set rollout.staleness: {saved_k} to resume, or "
                         "delete the run's state/ to start over")
