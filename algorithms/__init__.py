"""The RPG study's algorithms in pure torch: KL estimators, surrogate losses, clipping,
advantages and the named methods. No model, no I/O; `python -m algorithms.audit` checks
every surrogate's gradient against the exact one, `python -m algorithms.certify` which
gradient a KL setting (raw, or a peer framework's options: algorithms/peers.py) computes."""

from .advantages import ADVANTAGE_ESTIMATORS, compute_advantages
from .config import ClipConfig, LossConfig
from .correction import CORRECTION_METRICS, CORRECTIONS, CorrectionConfig, correct
from .kl import kl_estimate, kl_reward_penalty
from .losses import LOSS_METRICS, aggregate, compute_policy_loss
from .methods import METHODS, Method, get_method, with_overrides
from .objectives import OBJECTIVES, get_objective, register_objective
from .reference import REFERENCE_SCHEDULES, get_reference_schedule, register_reference_schedule

__all__ = [
    "ADVANTAGE_ESTIMATORS", "CORRECTIONS", "CORRECTION_METRICS", "CorrectionConfig", "LOSS_METRICS", "METHODS", "OBJECTIVES", "REFERENCE_SCHEDULES", "ClipConfig",
    "LossConfig", "Method", "aggregate", "compute_advantages", "compute_policy_loss", "correct",
    "get_method", "get_objective", "get_reference_schedule", "kl_estimate", "kl_reward_penalty", "register_objective",
    "register_reference_schedule",
    "with_overrides",
]
