"""The update: log-prob passes, and K epochs of mini-batch optimizer steps over micro-batches.

    updater = Updater(cfg, world, device, autocast, policy, optimizer, ref_schedule, counters)
    old_logp, entropy = updater.logprobs_no_grad(module, batch, with_entropy=True)
    metrics = updater.update(batch, old_logp, ref_logp, advantages, mu_logp)

Each mini-batch's loss (`algorithms.compute_policy_loss`) is accumulated over micro-batches,
each weighted so that the gradients sum, over micro-batches and ranks, to those of the
mini-batch's loss whatever the grouping; then the gradient is clipped and the step applied
unless the loss or the gradient norm is non-finite (too many of those in a row stop the
run). Loss metrics average over a step's updates, or take their maximum (MAX_OVER_UPDATES).

Legend: B sequences of the batch, T response length (padded), b and t those of a
micro-batch.
"""

from __future__ import annotations

import numpy as np
import torch

from algorithms import LOSS_METRICS, compute_policy_loss
from common.metrics import metric_meta
from trainer import distributed
from trainer.collection import generation_seed
from trainer.logprobs import PackedBatch, balanced_share, micro_batches

# Loss metrics reported as the maximum over a step's updates (micro-batches, mini-batches,
# epochs, ranks): those whose declared aggregation is "max"; the rest are weighted means.
MAX_OVER_UPDATES = frozenset(k for k in LOSS_METRICS if metric_meta(k).aggregation == "max")


def mb_rows(micro: torch.Tensor, device) -> torch.Tensor:
    """Row indices of a micro-batch; row 0 for the empty stand-in (weighted by 0)."""
    return micro if len(micro) else torch.zeros(1, dtype=torch.long, device=device)


def add_metric(sums: dict, key: str, value: torch.Tensor, weight=None) -> None:
    """Running aggregate of a loss metric over micro- and mini-batches: the maximum for
    MAX_OVER_UPDATES, else the (weighted) sum."""
    if key in MAX_OVER_UPDATES:
        sums[key] = value if key not in sums else torch.maximum(sums[key], value)
    else:
        sums[key] = sums.get(key, 0.0) + (value if weight is None else value * weight)


class NonFiniteError(RuntimeError):
    """Too many non-finite updates in a row."""


def loss_batch(batch: PackedBatch, truncated: torch.Tensor, mask_truncated: bool) -> PackedBatch:
    """The batch the update sees: with `rollout.mask_truncated`, responses cut at
    max_new_tokens get an all-zero response mask, so they add nothing to the loss nor to
    the token-mean's token count (TRL's mask_truncated_completions zeroes its completion
    mask the same way). Their rewards still count in the group baselines, as in TRL."""
    if not mask_truncated:
        return batch
    keep = (~truncated).to(batch.response_mask.dtype)[:, None]  # (B, 1)
    return PackedBatch(batch.input_ids, batch.attention_mask, batch.response_mask * keep,
                       batch.prompt_len)


def learning_rate(optim, step: int) -> float:
    """The LR of RL step `step` (1-based): linear warm-up over `optim.warmup_rl_steps` RL
    steps, then constant. Counted in RL steps, as verl steps its scheduler once per training
    step; unlike verl's schedule, step 1 gets lr / warmup instead of 0 (no wasted step).
    A function of the step alone, so a resumed run needs no scheduler state."""
    if optim.warmup_rl_steps <= 0:
        return optim.lr
    return optim.lr * min(1.0, step / optim.warmup_rl_steps)


def mini_batch_order(cfg, step: int, epoch: int, B: int, mini: int,
                     device="cpu") -> torch.Tensor:
    """The row order of one epoch of RL step `step`: seeded per (run seed, step, epoch) when
    the batch is split into mini-batches, else the batch as it is. Rows are group-major (a
    group's n rows together); optim.whole_groups shuffles groups, keeping each one's rows
    together."""
    if mini >= B:
        return torch.arange(B, device=device)
    gen = torch.Generator().manual_seed(generation_seed(cfg.seed, step, epoch))
    if not cfg.optim.whole_groups:
        return torch.randperm(B, generator=gen).to(device)
    n = cfg.rollout.n
    groups = torch.randperm(B // n, generator=gen)  # (G,)
    return (groups[:, None] * n + torch.arange(n)).reshape(-1).to(device)  # (G*n,)


class Updater:
    """The update of one run (see module doc). `counters` (trainer.state.Counters) is the
    run's: the current step (it seeds the mini-batch order), the non-finite skips it counts
    and the last checkpoint a NonFiniteError names."""

    def __init__(self, cfg, world, device: torch.device, autocast: torch.dtype | None,
                 policy, optimizer, ref_schedule, counters) -> None:
        self.cfg, self.world, self.device, self.autocast = cfg, world, device, autocast
        self.loss_cfg = cfg.resolved_method().loss
        self.policy, self.optimizer, self.ref_schedule = policy, optimizer, ref_schedule
        self.counters = counters

    def micro_batches(self, batch: PackedBatch, rows: torch.Tensor) -> list[torch.Tensor]:
        """This rank's micro-batches of `rows` (dealt to ranks by token count, so they finish
        together); padded with empty ones to the largest rank's count, since every FSDP2
        forward is a collective."""
        o = self.cfg.optim
        mine = balanced_share(batch, rows, self.world.rank, self.world.size)
        groups = micro_batches(batch, mine, o.micro_batch_size, o.max_tokens_per_micro_batch,
                               o.padding_free)
        empty = rows[:0]
        return groups + [empty] * (distributed.pad_to(len(groups), self.world) - len(groups))

    def forward(self, module, batch: PackedBatch, micro: torch.Tensor, with_entropy: bool):
        """Row indices, sub-batch and log-probs (b, t) of one micro-batch; an empty one runs a
        1-row stand-in (so the collectives match) whose result the caller weighs by 0."""
        idx = mb_rows(micro, self.device)
        mb = batch.rows(idx)
        logp, ent = module(mb, temperature=self.cfg.rollout.temperature,
                           with_entropy=with_entropy, autocast=self.autocast,
                           padding_free=self.cfg.optim.padding_free,
                           share_prompt=self.cfg.optim.share_prompt)
        return idx, mb, logp, ent

    @torch.no_grad()
    def logprobs_no_grad(self, module, batch: PackedBatch, with_entropy: bool):
        """(B, T) log-probs (and entropies) of `module`, micro-batched, no autograd; each
        rank computes its share of the rows, then the shares are summed into every rank."""
        was_training = module.training
        module.eval()
        B, T = batch.response_mask.shape
        logp = torch.zeros(B, T, device=self.device)
        entropy = torch.zeros(B, T, device=self.device)
        for rows in self.micro_batches(batch, torch.arange(B, device=self.device)):
            _, _, lp, ent = self.forward(module, batch, rows, with_entropy)
            if len(rows):
                logp[rows, : lp.shape[1]] = lp  # a micro-batch is trimmed to its longest row
                entropy[rows, : ent.shape[1]] = ent
        module.train(was_training)
        return distributed.all_sum(logp, self.world), distributed.all_sum(entropy, self.world)

    def accumulate_gradients(self, batch: PackedBatch, rows, old_logp, ref_logp, advantages,
                             mu_logp=None):
        """Backward of one mini-batch `rows` (this rank's share of it), micro-batch by
        micro-batch, each loss weighted so that the gradients sum, over micro-batches and
        ranks, to those of the mini-batch's loss whatever the grouping. Returns the
        mini-batch loss and its weighted metric sums (maxima for MAX_OVER_UPDATES), all global."""
        token_mean = self.loss_cfg.agg == "token-mean"
        mini_tokens = batch.response_mask[rows].sum().clamp_min(1.0)
        total_loss = torch.zeros((), device=self.device)
        sums: dict[str, torch.Tensor] = {}
        for micro in self.micro_batches(batch, rows):
            bonus = self.loss_cfg.entropy_coef > 0  # entropy (and its gradient) only if used
            idx, mb, logp, ent = self.forward(self.policy, batch, micro, with_entropy=bonus)
            t = mb.response_mask.shape[1]
            loss, metrics = compute_policy_loss(
                self.loss_cfg, logp, old_logp[idx, :t],
                None if ref_logp is None else ref_logp[idx, :t],
                advantages[idx] if advantages.dim() == 1 else advantages[idx, :t],
                mb.response_mask, norm_len=self.cfg.rollout.max_new_tokens,
                entropy=ent if bonus else None, mu_logp=None if mu_logp is None else mu_logp[idx, :t],
                correction=self.cfg.rollout.correction,
            )
            if not len(micro):
                w = torch.zeros((), device=self.device)
            elif token_mean:
                w = mb.response_mask.sum() / mini_tokens
            else:
                w = torch.tensor(len(micro) / len(rows), device=self.device)
            if self.counters.step in self.cfg.debug.nonfinite_steps:
                loss = loss * float("nan")
            # FSDP2 averages gradients over ranks; scaling by the world size sums them.
            (loss * w * self.world.size).backward()
            total_loss = total_loss + loss.detach() * w
            for k in LOSS_METRICS:
                if len(micro):
                    add_metric(sums, k, metrics[k], w)
        total_loss = distributed.all_sum(total_loss, self.world)
        for k in LOSS_METRICS:
            v = sums.get(k, torch.tensor(float("-inf") if k in MAX_OVER_UPDATES else 0.0,
                                         device=self.device))
            sums[k] = (distributed.all_max if k in MAX_OVER_UPDATES else distributed.all_sum)(
                v.reshape(()).clone(), self.world)
        return total_loss, sums

    def optimizer_step(self, params: list, total_loss: torch.Tensor) -> float | None:
        """Clip, then apply the step if loss and gradient norm are finite; returns the grad
        norm, or None for a skipped (non-finite) step. Too many skips in a row raise."""
        o, c = self.cfg.optim, self.counters
        clip = o.grad_clip if o.grad_clip is not None else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip)
        if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
            grad_norm = grad_norm.full_tensor()
        # One host sync per optimizer step: needed to decide whether to skip it.
        if bool(torch.isfinite(total_loss) & torch.isfinite(grad_norm)):
            self.optimizer.step()
            c.nonfinite_in_row = 0
            self.ref_schedule.after_optimizer_step()
            return grad_norm.item()
        self.optimizer.zero_grad(set_to_none=True)
        c.nonfinite_skips += 1
        c.nonfinite_in_row += 1
        if c.nonfinite_in_row >= o.max_nonfinite_in_row:
            raise NonFiniteError(
                f"step {c.step}: {c.nonfinite_in_row} non-finite losses or "
                f"gradients in a row (optim.max_nonfinite_in_row={o.max_nonfinite_in_row}); "
                f"last good checkpoint: "
                f"{c.last_checkpoint or 'none (no checkpoint saved yet)'}")
        return None

    def update(self, batch: PackedBatch, old_logp, ref_logp, advantages, mu_logp=None) -> dict:
        """K epochs of mini-batch optimizer steps; returns averaged loss metrics + grad norm.
        mu_logp: the sampler's log-probs (None: old_logp, as with the hf engine)."""
        o = self.cfg.optim
        B = batch.input_ids.shape[0]
        mini = o.mini_batch_size or B
        sums: dict[str, torch.Tensor] = {}
        grad_norms, n_mini = [], 0
        # The optimizer's (sharded) parameters: under FSDP2 the root's parameters() may be
        # its unsharded views between a forward and the next backward.
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.policy.train()
        for epoch in range(o.epochs):
            order = mini_batch_order(self.cfg, self.counters.step, epoch, B, mini, self.device)
            for start in range(0, B, mini):
                self.optimizer.zero_grad(set_to_none=True)
                total_loss, mini_sums = self.accumulate_gradients(
                    batch, order[start : start + mini], old_logp, ref_logp, advantages, mu_logp)
                for k, v in mini_sums.items():
                    add_metric(sums, k, v)
                n_mini += 1
                grad_norm = self.optimizer_step(params, total_loss)
                if grad_norm is not None:
                    grad_norms.append(grad_norm)
        out = {k: (v if k in MAX_OVER_UPDATES else v / n_mini).item() for k, v in sums.items()}
        out["grad_norm"] = float(np.mean(grad_norms)) if grad_norms else None
        return out
