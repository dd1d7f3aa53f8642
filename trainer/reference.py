"""Reference-policy schedules: which policy the KL term regularizes toward.

    rollout    reference = the policy that generated the batch (the paper's setting, Sec. 4):
               no reference model is held; the loss gets ref_logp=None.
    fixed      reference = the initial policy for the whole run (GRPO-style).
    every_k    reference refreshed to the current policy at the first rollout boundary after
               k optimizer steps (never mid-batch: the batch's ref_logp were computed
               once, before its updates, and must belong to the reference it is trained on).
    kl_target  refreshed when a moving average of the token KL to it exceeds kappa.

A held reference is one frozen, eval-mode copy (requires_grad False) of the policy; its
log-probs are computed once per rollout batch. Refreshing copies the policy's weights
into it in place (no second allocation).
"""

from __future__ import annotations

import copy

import torch


class Reference:
    """The schedule plus, when needed, the frozen reference model."""

    def __init__(self, schedule: str, policy=None, *, k: int = 10, kappa: float = 0.05,
                 kl_ema: float = 0.9) -> None:
        if schedule not in ("rollout", "fixed", "every_k", "kl_target"):
            raise ValueError(f"reference schedule={schedule!r}; choose rollout, fixed, every_k "
                             "or kl_target")
        self.schedule, self.k, self.kappa, self.kl_ema = schedule, k, kappa, kl_ema
        self.model = None
        if schedule != "rollout":
            if policy is None:
                raise ValueError(f"reference schedule {schedule!r} needs the initial policy")
            self.model = copy.deepcopy(policy).eval()
            self.model.requires_grad_(False)
        self.updates = 0  # ref_updates: refreshes so far
        self.optimizer_steps_since = 0
        self.kl_average: float | None = None

    @property
    def held(self) -> bool:
        """True when a reference model is in memory (every schedule but rollout)."""
        return self.model is not None

    def after_optimizer_step(self) -> None:
        """Count optimizer steps (every_k refreshes at the next rollout boundary)."""
        self.optimizer_steps_since += 1

    def after_step(self, policy, kl_to_ref: float | None) -> None:
        """At the rollout boundary. every_k: refresh once k optimizer steps have passed.
        kl_target: update the moving average of the step's token KL; refresh past kappa."""
        if self.schedule == "every_k" and self.optimizer_steps_since >= self.k:
            self.refresh(policy)
        if self.schedule != "kl_target" or kl_to_ref is None:
            return
        a = self.kl_ema
        self.kl_average = kl_to_ref if self.kl_average is None else a * self.kl_average + (
            1 - a) * kl_to_ref
        if self.kl_average > self.kappa:
            self.refresh(policy)

    @torch.no_grad()
    def refresh(self, policy) -> None:
        """Copy the policy's current weights into the reference."""
        for ref_t, pol_t in zip(self.model.state_dict().values(), policy.state_dict().values()):
            ref_t.copy_(pol_t)
        self.updates += 1
        self.optimizer_steps_since = 0
        self.kl_average = None

    def state_dict(self, weights=None) -> dict:
        """Counters, and the weights when they differ from the initial policy (resume).
        `weights(model)` reads them (default: a CPU copy of the state dict; the trainer
        passes a gatherer for sharded models)."""
        state = {"updates": self.updates, "optimizer_steps_since": self.optimizer_steps_since,
                 "kl_average": self.kl_average}
        if self.model is not None and self.updates > 0:
            state["weights"] = (weights(self.model) if weights else
                                {k: v.detach().cpu().clone()
                                 for k, v in self.model.state_dict().items()})
        return state

    def load_state_dict(self, state: dict, load=None) -> None:
        """Counters and weights back; `load(model, weights)` writes the weights (default:
        `model.load_state_dict`)."""
        self.updates = state["updates"]
        self.optimizer_steps_since = state["optimizer_steps_since"]
        self.kl_average = state["kl_average"]
        if "weights" in state:
            (load or (lambda m, w: m.load_state_dict(w)))(self.model, state["weights"])
