"""The optimizers `optim.optimizer` names, and which weights an evaluation sees under each.

    adamw                torch.optim.AdamW
    schedule_free_adamw  schedulefree.AdamWScheduleFree (Defazio et al. 2024), the
                         `optim_type=schedulefree` of about half of the released 7B RPG scripts

Schedule-free keeps two weight sequences: the gradient is taken at y (the parameters in the
optimizer's train mode) and the average x is the model to evaluate (its eval mode). The
trainer stays in train mode for rollouts, log-prob passes and updates, so the sampler, the
behaviour log-probs and the gradient all belong to y (on-policy means w = 1), and switches
to x only to write an HF checkpoint (`evaluation_weights`): evaluation jobs read x. The
resume state is saved in train mode (y in the weights, z and the second moment in the
optimizer state), so a resumed run continues exactly. Departure: the released code calls
`optimizer.eval()` before its log-prob pass and `train()` before its update, so its old
log-probs come from x while its samples and gradients come from y (w != 1 on-policy); its
checkpoints hold y. The learning-rate warm-up stays the trainer's (`learning_rate`), as the
released scripts keep verl's warm-up scheduler on top of schedule-free (warmup_steps 0).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

import torch

from algorithms.registry import Registry

# name -> builder(params, OptimConfig): the one list of `optim.optimizer` values
OPTIMIZERS: Registry[Callable[[Iterable, object], torch.optim.Optimizer]] = Registry("optimizer")


@OPTIMIZERS.register("adamw")
def _adamw(params: Iterable, optim) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=optim.lr, betas=optim.betas,
                             weight_decay=optim.weight_decay)


@OPTIMIZERS.register("schedule_free_adamw")
def _schedule_free_adamw(params: Iterable, optim) -> torch.optim.Optimizer:
    import schedulefree  # a dependency; imported here so adamw runs need not load it

    optimizer = schedulefree.AdamWScheduleFree(params, lr=optim.lr, betas=optim.betas,
                                               weight_decay=optim.weight_decay, warmup_steps=0)
    optimizer.train()  # y from the first step on, as the released update_policy does
    _drop_empty_state(optimizer)
    return optimizer


def _drop_empty_state(optimizer: torch.optim.Optimizer) -> None:
    """Schedule-free's train()/eval() read self.state[p] of a defaultdict, leaving an empty
    entry per parameter before the first step; torch.distributed.checkpoint then takes the
    state as initialised, its resume template holds no z or second moment, and a resume
    silently drops them (the resume test caught it)."""
    for p in [p for p, state in optimizer.state.items() if not state]:
        del optimizer.state[p]


def build_optimizer(params: Iterable, optim) -> torch.optim.Optimizer:
    """The optimizer `optim.optimizer` names over `params`, from an OptimConfig."""
    return OPTIMIZERS.get(optim.optimizer)(params, optim)


def has_eval_weights(optimizer: torch.optim.Optimizer) -> bool:
    """True for an optimizer whose evaluation weights differ from its training ones."""
    return callable(getattr(optimizer, "eval", None)) and callable(getattr(optimizer, "train",
                                                                           None))


@contextlib.contextmanager
def evaluation_weights(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Inside: the parameters hold the weights to evaluate (schedule-free: x). On exit the
    training weights y are restored bit for bit from a copy (eval() then train() would
    round them), so saving a checkpoint never changes the run. Costs one copy of this
    rank's parameters while it lasts; a no-op for AdamW."""
    if not has_eval_weights(optimizer):
        yield
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    with torch.no_grad():
        y = [p.detach().clone() for p in params]
    optimizer.eval()
    try:
        yield
    finally:
        optimizer.train()
        _drop_empty_state(optimizer)
        with torch.no_grad():
            for p, saved in zip(params, y):
                p.copy_(saved)
