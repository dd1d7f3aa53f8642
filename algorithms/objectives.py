"""The registry of policy-loss objectives (verl's `register_policy_loss` style).

An objective is registered where its loss terms are defined (`algorithms/losses.py`):

    def _check_mine(cfg: LossConfig) -> None:       # its validity rules, next to it
        if cfg.divergence is not None:
            raise invalid(cfg, "divergence", cfg.divergence, "leave it null")

    @register_objective("mine", default_form="differentiable", check=_check_mine)
    def _mine_terms(cfg, logp, logw, logq, adv) -> Terms: ...

`LossConfig(objective="mine")` then validates with `_check_mine`, and `compute_policy_loss`
calls `_mine_terms`. A failed lookup lists what is registered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .registry import Registry

if TYPE_CHECKING:
    from .config import LossConfig


@dataclass(frozen=True)
class Objective:
    """One registered objective: its per-token terms and the rules a LossConfig must meet.

    terms(cfg, logp, logw, logq, adv) -> losses.Terms: the per-token loss terms.
    check(cfg): raises ValueError (see `invalid`) when cfg is not a valid config of it.
    default_form: the `form` a config gets when it does not say.
    exact_kl: the KL term is exact (kl_placement "exact" by default); otherwise the
        default placement is "loss" with an estimator and "none" without.
    uses_behaviour: the gradient depends on the behaviour policy's log-probs (through
        w = pi / mu): true of every objective today, so the trainer refuses rollout.top_p < 1,
        whose truncated sampler the full-softmax log-probs do not describe.
    """

    name: str
    terms: Callable[..., Any]
    check: Callable[[LossConfig], None]
    default_form: str
    exact_kl: bool = False
    uses_behaviour: bool = True

    def default_placement(self, estimator: str | None) -> str:
        if self.exact_kl:
            return "exact"
        return "loss" if estimator else "none"


OBJECTIVES: Registry[Objective] = Registry("objective")


def register_objective(name: str, *, check: Callable[[LossConfig], None], default_form: str,
                       exact_kl: bool = False, uses_behaviour: bool = True) -> Callable:
    """Decorator: register the decorated terms function as objective `name`."""

    def decorate(terms: Callable) -> Callable:
        OBJECTIVES.register(name, Objective(name, terms, check, default_form, exact_kl,
                                            uses_behaviour))
        return terms

    return decorate


get_objective = OBJECTIVES.get  # the registered objective `name`; a miss lists the names


def invalid(cfg: LossConfig, field: str, value, allowed: str) -> ValueError:
    """The one-line error of a check: the field, the bad value, the objective and the fix."""
    return ValueError(f"LossConfig.{field}={value!r} is invalid with objective="
                      f"{cfg.objective!r}: {allowed}")
