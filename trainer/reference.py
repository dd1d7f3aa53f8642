"""The reference policy of a run: a registered schedule (`algorithms.reference`) plus, when
the schedule holds one, the frozen reference model.

A held reference is one frozen, eval-mode copy (requires_grad False) of the policy; its
log-probs are computed once per rollout batch. Distributed, it starts as a meta twin and
receives rank 0's initial weights into its shards (no full copy on any rank). Refreshing copies the policy's weights
into it in place (no second allocation).

Under LoRA (`model.lora`) no copy is held: the reference is the policy itself with its
adapters switched off (the base model: the initial policy, since adapters start at B = 0)
until a refresh, then with a snapshot of the adapters swapped in (every_k, kl_target). The
log-probs equal the held copy's on the same weights (tests/trainer/test_lora.py).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch

from algorithms.reference import get_reference_schedule
from trainer import lora
from trainer.distributed import meta_twin


class Reference:
    """The schedule plus, when needed, the frozen reference model.

    `settings` are the run config's `method.reference` keys the schedule uses (k, kappa,
    kl_ema); a schedule name that is not registered is a ValueError listing those that are.
    `dtype`: the held copy's storage dtype (None: the policy's); a refresh casts into it.
    `empty`: hold a meta-device twin (no storage; distributed set-up fills its shards from
    rank 0, `trainer.distributed.load_from_rank0`) instead of a copy of the weights.
    `adapters`: the policy carries LoRA adapters: hold no copy (module doc).
    """

    def __init__(self, schedule: str, policy=None, *, dtype: torch.dtype | None = None,
                 empty: bool = False, adapters: bool = False, **settings) -> None:
        self.schedule = get_reference_schedule(schedule)(**settings)
        self.model = None
        self.lora = adapters and self.schedule.holds_model
        self.adapters: dict[str, torch.Tensor] | None = None  # LoRA, after a refresh
        if self.schedule.holds_model and not self.lora:
            if policy is None:
                raise ValueError(f"reference schedule {schedule!r} needs the initial policy")
            self.model = (meta_twin(policy) if empty else copy.deepcopy(policy)).eval()
            self.model.requires_grad_(False)
            if dtype is not None:  # e.g. bf16: half the memory; it is never optimized
                self.model.to(dtype)
        self.updates = 0  # ref_updates: refreshes so far

    @property
    def held(self) -> bool:
        """True when the reference is its own policy (every schedule but rollout): its
        log-probs are computed, from a held copy or (LoRA) from the policy's adapters."""
        return self.model is not None or self.lora

    @contextlib.contextmanager
    def applied(self, policy) -> Iterator[None]:
        """Inside: the reference's weights are where its forward reads them. A held copy
        needs nothing; under LoRA the `policy` (the HF model) computes as the reference: its
        adapters off (no refresh yet: the base model) or set to the refreshed snapshot."""
        if not self.lora:
            yield
        elif self.adapters is None:
            with lora.adapters_off(policy):
                yield
        else:
            with lora.adapters_from(policy, self.adapters):
                yield

    def after_optimizer_step(self) -> None:
        self.schedule.after_optimizer_step()

    def after_step(self, policy, kl_to_ref: float | None) -> None:
        """At the rollout boundary: refresh when the schedule says so."""
        if self.schedule.refresh_due(kl_to_ref):
            self.refresh(policy)

    @torch.no_grad()
    def refresh(self, policy) -> None:
        """Copy the policy's current weights into the reference (LoRA: its adapters)."""
        if self.lora:
            self.adapters = lora.adapter_snapshot(policy)
        else:
            for ref_t, pol_t in zip(self.model.state_dict().values(),
                                    policy.state_dict().values()):
                ref_t.copy_(pol_t)
        self.updates += 1
        self.schedule.on_refresh()

    @property
    def refreshed(self) -> bool:
        """True when the held reference differs from the initial policy (its weights are then
        part of a resume state)."""
        return self.held and self.updates > 0

    def counters(self) -> dict:
        """The schedule's state and the refresh count, without weights (the trainer saves
        the weights sharded, beside these)."""
        return {"updates": self.updates, **self.schedule.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """The counters of `counters()` back; the held weights come from the sharded resume
        state (`trainer.sharded_state`), never from here."""
        self.updates = state["updates"]
        self.schedule.load_state_dict(state)
