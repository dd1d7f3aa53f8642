"""The reference policy of a run: a registered schedule (`algorithms.reference`) plus, when
the schedule holds one, the frozen reference model.

A held reference is one frozen, eval-mode copy (requires_grad False) of the policy; its
log-probs are computed once per rollout batch. Distributed, it starts as a meta twin and
receives rank 0's initial weights into its shards (no full copy on any rank). Refreshing copies the policy's weights
into it in place (no second allocation).
"""

from __future__ import annotations

import copy

import torch

from algorithms.reference import get_reference_schedule
from trainer.distributed import meta_twin


class Reference:
    """The schedule plus, when needed, the frozen reference model.

    `settings` are the run config's `method.reference` keys the schedule uses (k, kappa,
    kl_ema); a schedule name that is not registered is a ValueError listing those that are.
    `dtype`: the held copy's storage dtype (None: the policy's); a refresh casts into it.
    `empty`: hold a meta-device twin (no storage; distributed set-up fills its shards from
    rank 0, `trainer.distributed.load_from_rank0`) instead of a copy of the weights.
    """

    def __init__(self, schedule: str, policy=None, *, dtype: torch.dtype | None = None,
                 empty: bool = False, **settings) -> None:
        self.schedule = get_reference_schedule(schedule)(**settings)
        self.model = None
        if self.schedule.holds_model:
            if policy is None:
                raise ValueError(f"reference schedule {schedule!r} needs the initial policy")
            self.model = (meta_twin(policy) if empty else copy.deepcopy(policy)).eval()
            self.model.requires_grad_(False)
            if dtype is not None:  # e.g. bf16: half the memory; it is never optimized
                self.model.to(dtype)
        self.updates = 0  # ref_updates: refreshes so far

    @property
    def held(self) -> bool:
        """True when a reference model is in memory (every schedule but rollout)."""
        return self.model is not None

    def after_optimizer_step(self) -> None:
        self.schedule.after_optimizer_step()

    def after_step(self, policy, kl_to_ref: float | None) -> None:
        """At the rollout boundary: refresh when the schedule says so."""
        if self.schedule.refresh_due(kl_to_ref):
            self.refresh(policy)

    @torch.no_grad()
    def refresh(self, policy) -> None:
        """Copy the policy's current weights into the reference."""
        for ref_t, pol_t in zip(self.model.state_dict().values(), policy.state_dict().values()):
            ref_t.copy_(pol_t)
        self.updates += 1
        self.schedule.on_refresh()

    @property
    def refreshed(self) -> bool:
        """True when the held reference differs from the initial policy (its weights are then
        part of a resume state)."""
        return self.model is not None and self.updates > 0

    def counters(self) -> dict:
        """The schedule's state and the refresh count, without weights (the trainer saves
        the weights sharded, beside these)."""
        return {"updates": self.updates, **self.schedule.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """The counters of `counters()` back; the held weights come from the sharded resume
        state (`trainer.sharded_state`), never from here."""
        self.updates = state["updates"]
        self.schedule.load_state_dict(state)
