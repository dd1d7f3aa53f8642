"""Rollouts: a generation engine (common.generation: `hf` = the training model's own
`generate`, `vllm` = an in-process vLLM beside it) bound to the run's sampling settings.

    rollout = make_engine(cfg, model, tokenizer, model_path=..., seed=..., compute_dtype=None)
    samples = rollout.generate(prompts, n=8, seed=step_seed)   # list (prompts) of list (n)
    rollout.sleep()                     # once, after the rollout's last round (vllm on GPU)
    ...update the model...
    rollout.sync_weights(model)                                # vllm: push; hf: nothing

Behaviour log-probs pi_old are always recomputed by the training model (trainer.logprobs).
The log-probs vLLM returns with its samples are the sampler's own, mu (`sampler_logprobs`):
the `rollout_logprob_gap_*` metrics (`logprob_gap`) measure how far they are from pi_old
(~0 in float32; bf16 inference vs training is a known source of off-policy bias), and
`rollout.correction` (algorithms.correction) corrects the loss for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from common.generation import ENGINES, Engine, Sample

# Logged every step (None with the hf engine, which samples from the training model itself).
LOGPROB_GAP_METRICS = ("rollout_logprob_gap_mean", "rollout_logprob_gap_max")


@dataclass
class RolloutEngine:
    """An engine plus the run's fixed sampling settings (rollout.temperature, ...)."""

    engine: Engine
    temperature: float
    top_p: float
    max_new_tokens: int

    def generate(self, prompts: list[str], *, n: int, seed: int) -> list[list[Sample]]:
        return self.engine.generate(prompts, n=n, temperature=self.temperature,
                                    top_p=self.top_p, max_new_tokens=self.max_new_tokens,
                                    seed=seed)

    def sleep(self) -> None:
        """Hand the accelerator back to the trainer after a rollout's last generate (its
        dynamic-sampling rounds share one wake); a no-op for engines that cannot sleep."""
        self.engine.sleep()

    def sync_weights(self, model) -> None:
        """Give the engine the model's current weights. The gradients are freed first (the
        update is over; the next mini-batch's zero_grad would drop them anyway), so an
        engine that wakes on the accelerator finds that memory returned."""
        for p in model.parameters():
            p.grad = None
        self.engine.sync_weights(model)


def make_engine(rollout_cfg, model, tokenizer, *, model_path: str, seed: int,
                compute_dtype: torch.dtype | None = None, run_dir=None) -> RolloutEngine:
    """The engine named by `rollout_cfg.engine` (a trainer.config.RolloutConfig), set up
    by its own `Engine.for_rollout`.

    An engine that holds its own copy of the weights gets the training model's at once:
    the model may have been resumed, and at `vllm_sleep_level: 2` vLLM discards the
    weights it loaded from `model_path` when it first sleeps.
    """
    engine = ENGINES.get(rollout_cfg.engine).for_rollout(
        rollout_cfg, model, tokenizer, model_path=model_path, seed=seed,
        compute_dtype=compute_dtype)
    if run_dir is not None and hasattr(engine, "spill_to"):  # files it hands itself (vllm)
        engine.spill_to(run_dir)
    rollout = RolloutEngine(engine, rollout_cfg.temperature, rollout_cfg.top_p,
                            rollout_cfg.max_new_tokens)
    rollout.sync_weights(model)
    return rollout


def logprob_gap(mu_logp: torch.Tensor, trainer_logp: torch.Tensor,
                mask: torch.Tensor) -> dict[str, float | None]:
    """Mean and max over sampled tokens of |log pi_engine - log pi_trainer|.

    mu_logp: the sampler's log-probs from `sampler_logprobs`, which is `trainer_logp` itself
    when the engine returned none (hf engine: no gap to measure, the metrics are None).
    trainer_logp, mask: (B, T), as from trainer.logprobs.response_logprobs on the packed
    batch. This syncs with the host once.
    """
    if mu_logp is trainer_logp:
        return dict.fromkeys(LOGPROB_GAP_METRICS)
    gap = (mu_logp - trainer_logp).abs() * mask  # (B, T), 0 off the responses
    tokens = mask.sum().clamp_min(1)
    mean, top = torch.stack([gap.sum() / tokens, gap.max()]).tolist()
    return {"rollout_logprob_gap_mean": mean, "rollout_logprob_gap_max": top}


def sampler_logprobs(engine_logprobs: list[list[float] | None] | None,
                     trainer_logp: torch.Tensor) -> torch.Tensor:
    """The sampler's log-probs mu of the batch's tokens, (B, T) like `trainer_logp`: the
    engine's where every response has them (vllm), else `trainer_logp` itself (hf: the
    training model sampled in the same compute dtype: mu = pi_old, exactly in float32, up to
    bf16 rounding under bf16). Off the responses: trainer_logp's."""
    if not engine_logprobs or any(lp is None for lp in engine_logprobs):
        return trainer_logp
    mu = trainer_logp.clone()
    for row, lp in enumerate(engine_logprobs):
        mu[row, : len(lp)] = torch.tensor(lp, dtype=mu.dtype)
    return mu
