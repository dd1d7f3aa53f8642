"""Reference-policy schedules: when the policy the KL term regularizes toward is refreshed.

    rollout    reference = the policy that generated the batch (the paper's setting, Sec. 4):
               no reference model is held; the loss gets ref_logp=None.
    fixed      reference = the initial policy for the whole run (GRPO-style).
    every_k    reference refreshed to the current policy at the first rollout boundary after
               k optimizer steps (never mid-batch: the batch's ref_logp were computed
               once, before its updates, and must belong to the reference it is trained on).
    kl_target  refreshed when a moving average of the token KL to it exceeds kappa.

A schedule only decides; the trainer (`trainer.reference.Reference`) holds the frozen
reference model and copies the policy into it when `refresh_due` says so. To add one, write
a subclass here and decorate it with `@register_reference_schedule("name")`: the run config
(`method.reference.schedule`), the sweep's `axes.reference` and the methods' `reference`
field all accept the registered names. Settings come from the run config's
`method.reference` section (`k`, `kappa`, `kl_ema`); a new setting is a field there.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .registry import Registry


class ReferenceSchedule:
    """Base: a held reference that is never refreshed (the `fixed` schedule's behaviour).

    The trainer calls `after_optimizer_step()` after every applied optimizer step and, at
    each rollout boundary, `refresh_due(kl_to_ref)` (the step's token KL to the reference,
    None when it was not measured); after a refresh it calls `on_refresh()`. `state_dict`
    holds what must survive a resume.
    """

    name: ClassVar[str] = ""
    holds_model: ClassVar[bool] = True  # False: the reference is the rollout policy itself

    def __init__(self, **settings: Any) -> None:
        """`settings`: the run config's `method.reference` keys; each schedule takes the
        ones it uses as keyword arguments and ignores the rest."""

    def after_optimizer_step(self) -> None:
        pass

    def refresh_due(self, kl_to_ref: float | None) -> bool:
        return False

    def on_refresh(self) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


REFERENCE_SCHEDULES: Registry[type[ReferenceSchedule]] = Registry("reference schedule")


def register_reference_schedule(name: str):
    """Class decorator: register a ReferenceSchedule subclass under `name`."""

    def decorate(cls: type[ReferenceSchedule]) -> type[ReferenceSchedule]:
        REFERENCE_SCHEDULES.register(name, cls)
        cls.name = name
        return cls

    return decorate


get_reference_schedule = REFERENCE_SCHEDULES.get  # a miss lists the registered schedules


@register_reference_schedule("rollout")
class RolloutReference(ReferenceSchedule):
    """The reference is the behaviour policy of each batch: nothing held, nothing to refresh."""

    holds_model = False


@register_reference_schedule("fixed")
class FixedReference(ReferenceSchedule):
    """The initial policy for the whole run."""


@register_reference_schedule("every_k")
class EveryKReference(ReferenceSchedule):
    """Refreshed at the first rollout boundary after `k` optimizer steps."""

    def __init__(self, *, k: int, **_: Any) -> None:
        self.k = k
        self.optimizer_steps_since = 0

    def after_optimizer_step(self) -> None:
        self.optimizer_steps_since += 1

    def refresh_due(self, kl_to_ref: float | None) -> bool:
        return self.optimizer_steps_since >= self.k

    def on_refresh(self) -> None:
        self.optimizer_steps_since = 0

    def state_dict(self) -> dict:
        return {"optimizer_steps_since": self.optimizer_steps_since}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer_steps_since = state["optimizer_steps_since"]


@register_reference_schedule("kl_target")
class KLTargetReference(ReferenceSchedule):
    """Refreshed when the moving average (factor `kl_ema`) of the step's KL to the reference
    exceeds `kappa`; the average restarts after each refresh."""

    def __init__(self, *, kappa: float, kl_ema: float, **_: Any) -> None:
        self.kappa, self.kl_ema = kappa, kl_ema
        self.kl_average: float | None = None

    def refresh_due(self, kl_to_ref: float | None) -> bool:
        if kl_to_ref is None:
            return False
        a = self.kl_ema
        self.kl_average = (kl_to_ref if self.kl_average is None
                           else a * self.kl_average + (1 - a) * kl_to_ref)
        return self.kl_average > self.kappa

    def on_refresh(self) -> None:
        self.kl_average = None

    def state_dict(self) -> dict:
        return {"kl_average": self.kl_average}

    def load_state_dict(self, state: dict) -> None:
        self.kl_average = state["kl_average"]
