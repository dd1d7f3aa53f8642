"""The `hf` engine: transformers `generate` (KV cache, left padding), CPU or GPU.

    engine = HFEngine.from_checkpoint("results/x/checkpoints/step_40", EngineOptions())
    engine = HFEngine(model, tokenizer)   # rollouts: the training model itself, no copy

Sampling settings are explicit (`sampling_generation_config`) and the checkpoint's
generation_config.json is hidden from `generate` (`checkpoint_defaults_ignored`).
Legend: B rows per generate call, L prompt length (padded), T new tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig

from common.generation.base import (
    Engine,
    EngineOptions,
    Sample,
    Weights,
    check_checkpoint,
    check_sampling,
    register_engine,
)
from common.prompts import adds_special_tokens


def eos_ids(model, tokenizer) -> set[int]:
    """Every token id that ends a response: the model's generation_config and tokenizer EOS."""
    eos = getattr(model.generation_config, "eos_token_id", None)
    ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("neither the model's generation_config nor the tokenizer defines EOS")
    return ids


def sampling_generation_config(
    model, tokenizer, *, temperature: float, top_p: float, max_new_tokens: int
) -> GenerationConfig:
    """Every setting `generate` samples with, explicit: plain softmax at `temperature` with
    nucleus `top_p` (or greedy at temperature 0), top_k off, repetition_penalty 1, EOS/pad.

    Unset (None) fields would be filled from the checkpoint's generation_config.json and then
    from transformers' defaults (top_k=50): use it under `checkpoint_defaults_ignored`.
    """
    ends = eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(ends)
    common = {"max_new_tokens": max_new_tokens, "eos_token_id": sorted(ends),
              "pad_token_id": pad_id, "num_beams": 1, "repetition_penalty": 1.0,
              "use_cache": True}
    if temperature == 0:
        return GenerationConfig(do_sample=False, **common)
    return GenerationConfig(do_sample=True, temperature=temperature, top_p=top_p, top_k=0,
                            **common)


@contextmanager
def checkpoint_defaults_ignored(model) -> Iterator[None]:
    """Hide the checkpoint's generation_config (top_k, repetition_penalty, min_p, bad words,
    ...) from `generate` for the duration; the sampling settings come only from
    `sampling_generation_config`. transformers merges `model.generation_config` into any
    unset field of the config passed in, so passing a config alone is not enough."""
    saved = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved


def hf_generate(
    model,
    tokenizer,
    prompts: list[str],
    *,
    n: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    seed: int,
    batch_size: int = 64,
    progress: bool = False,
) -> list[list[Sample]]:
    """n samples per prompt (outer list: prompts, inner: samples) with `model.generate`.

    Left padding and the KV cache; sampling when temperature > 0, greedy otherwise. The RNG
    is seeded inside `torch.random.fork_rng`, so the caller's global RNG state is untouched
    and the same inputs + seed + batch_size give the same outputs on CPU. Rows are the
    prompts each repeated n times, generated `batch_size` rows at a time.
    """
    check_sampling(n, temperature, top_p, max_new_tokens)
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    ends = eos_ids(model, tokenizer)
    config = sampling_generation_config(model, tokenizer, temperature=temperature, top_p=top_p,
                                        max_new_tokens=max_new_tokens)
    rows = [p for p in prompts for _ in range(n)]  # P*n rows, prompt-major
    device = next(model.parameters()).device
    cuda_devices = [device.index or 0] if device.type == "cuda" else []
    out: list[Sample] = []
    was_training = model.training
    old_side = tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    try:
        # no_grad, not inference_mode: FSDP2-sharded weights (gathered for decoding) must stay
        # usable by autograd afterwards.
        with (torch.random.fork_rng(devices=cuda_devices), torch.no_grad(),
              checkpoint_defaults_ignored(model)):
            torch.manual_seed(seed)
            starts = range(0, len(rows), batch_size)
            for start in tqdm(starts, desc="generate", disable=not progress, unit="batch"):
                enc = tokenizer(
                    rows[start : start + batch_size],
                    return_tensors="pt",
                    padding=True,
                    add_special_tokens=adds_special_tokens(tokenizer),
                ).to(device)
                generated = model.generate(
                    input_ids=enc["input_ids"],  # (B, L)
                    attention_mask=enc["attention_mask"],
                    generation_config=config,
                )  # (B, L + T'), T' <= max_new_tokens
                for row in generated[:, enc["input_ids"].shape[1] :].tolist():
                    out.append(_to_sample(row, ends, tokenizer))
    finally:
        tokenizer.padding_side = old_side
        model.train(was_training)
    return [out[i * n : (i + 1) * n] for i in range(len(prompts))]


def _to_sample(row: list[int], ends: set[int], tokenizer) -> Sample:
    """Cut a generated row after its first EOS (what follows is padding)."""
    stop = next((i for i, t in enumerate(row) if t in ends), None)
    ids = row if stop is None else row[: stop + 1]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    return Sample(token_ids=ids, text=text, finish_reason="length" if stop is None else "stop")


@register_engine
class HFEngine(Engine):
    """transformers `generate` on a model held in this process (the training model for
    rollouts, so pushing weights is a no-op; a loaded checkpoint for evaluation)."""

    name = "hf"

    def __init__(self, model, tokenizer, *, batch_size: int = 64, progress: bool = False,
                 checkpoint: Path | None = None) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.progress = batch_size, progress
        self.checkpoint = checkpoint  # the directory the weights came from, if any

    @classmethod
    def from_checkpoint(cls, path: str | Path, options: EngineOptions) -> HFEngine:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = check_checkpoint(path)
        device = options.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = options.dtype if options.dtype == "auto" else getattr(torch, options.dtype)
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
        return cls(model, tokenizer, batch_size=options.batch_size, progress=options.progress,
                   checkpoint=path)

    def generate(self, prompts: list[str], *, n: int, temperature: float, top_p: float,
                 max_new_tokens: int, seed: int) -> list[list[Sample]]:
        return hf_generate(self.model, self.tokenizer, prompts, n=n, temperature=temperature,
                           top_p=top_p, max_new_tokens=max_new_tokens, seed=seed,
                           batch_size=self.batch_size, progress=self.progress)

    def load_weights(self, weights: Weights) -> None:
        """Copy each tensor into the parameter (or buffer) of that name, in the model's own
        dtype and device. Every entry of the state dict must be covered, except aliases of
        a covered tensor (a tied head)."""
        state = self.model.state_dict()
        seen: set[int] = set()
        with torch.no_grad():
            for name, tensor in weights:
                if name not in state:
                    raise ValueError(f"weight {name!r} is not in the {type(self.model).__name__} "
                                     "state dict (another architecture?)")
                state[name].copy_(tensor)
                seen.add(state[name].data_ptr())
        missing = [k for k, t in state.items() if t.data_ptr() not in seen]
        if missing:
            raise ValueError(f"weights for {missing[:5]} were not given; the model would mix "
                             "two checkpoints")

    def sync_weights(self, model) -> None:
        """Nothing to do when the engine samples from that very model (rollouts)."""
        if model is not self.model:
            super().sync_weights(model)
