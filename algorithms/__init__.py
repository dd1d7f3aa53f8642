"""The RPG study's algorithms in pure torch: KL estimators, surrogate losses, clipping,
advantages and the named methods. No model, no I/O; `python -m algorithms.audit` checks
every surrogate's gradient against the exact one."""

from .advantages import ADVANTAGE_ESTIMATORS, compute_advantages
from .config import ClipConfig, LossConfig
from .kl import kl_estimate, kl_reward_penalty
from .losses import OBJECTIVES, aggregate, compute_policy_loss
from .methods import METHODS, REFERENCE_SCHEDULES, Method, get_method, with_overrides

__all__ = [
    "ADVANTAGE_ESTIMATORS", "METHODS", "OBJECTIVES", "REFERENCE_SCHEDULES", "ClipConfig",
    "LossConfig", "Method", "aggregate", "compute_advantages", "compute_policy_loss",
    "get_method", "kl_estimate", "kl_reward_penalty", "with_overrides",
]
