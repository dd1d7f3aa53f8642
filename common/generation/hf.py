"""The `hf` engine: a transformers model decoding with its KV cache, left padding, CPU or GPU.

    engine = HFEngine.from_checkpoint("results/x/checkpoints/step_40", EngineOptions())
    engine = HFEngine(model, tokenizer)   # rollouts: the training model itself, no copy

`hf_generate` runs the decoding loop of transformers' `generate` (`_sample`) itself, with one
change: each distinct prompt is prefilled once and its KV cache copied to its n rows, instead
of prefilling every row (n-fold work for the prompt, the larger part of a tiny model's
generation). Every model call, logits warper and RNG draw is the one `generate` makes, so
the samples are the same (tests/eval/test_generation_hf.py compares them with `generate`).
Only temperature and top_p shape the distribution; the checkpoint's generation_config.json
is never read (`sampling_generation_config` and `checkpoint_defaults_ignored` are what a
caller of `model.generate` needs for the same). docs/performance.md "Speed on CPU" has the
measurements. transformers is imported where it is used: this module registers the engine,
and the registry is read where no model runs (the Snakefile's DAG, a run config's check),
which then does not pay transformers' ~4.5 s import.

Legend: B rows per generate call, U distinct prompts among them, L prompt length (padded),
T new tokens, V vocabulary.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

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

if TYPE_CHECKING:
    from transformers import GenerationConfig, LogitsProcessorList


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
    from transformers import GenerationConfig

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
    from transformers import GenerationConfig

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
    autocast: torch.dtype | None = None,
    logprobs: bool = False,
) -> list[list[Sample]]:
    """n samples per prompt (outer list: prompts, inner: samples), as `model.generate` samples.

    Left padding and the KV cache; sampling when temperature > 0, greedy otherwise. The RNG
    is seeded inside `torch.random.fork_rng`, so the caller's global RNG state is untouched
    and the same inputs + seed + batch_size give the same outputs on CPU. Rows are the
    prompts each repeated n times, generated `batch_size` rows at a time. `autocast`: every
    forward under `torch.autocast` in that dtype (the trainer's compute dtype, so the
    rollouts' numerics are its log-prob pass's). `logprobs`: each Sample carries its tokens'
    log-probs under the distribution sampled from (float32 log-softmax of the warped scores).
    """
    check_sampling(n, temperature, top_p, max_new_tokens)
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    ends = eos_ids(model, tokenizer)
    config = sampling_generation_config(model, tokenizer, temperature=temperature, top_p=top_p,
                                        max_new_tokens=max_new_tokens)
    pad_id = config.pad_token_id
    warpers = sampling_warpers(temperature, top_p)
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
        with torch.random.fork_rng(devices=cuda_devices), torch.no_grad(), \
                torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
            torch.manual_seed(seed)
            starts = range(0, len(rows), batch_size)
            for start in tqdm(starts, desc="generate", disable=not progress, unit="batch"):
                distinct, copies = runs_of_equal(rows[start : start + batch_size])
                # Padded to the longest of the distinct prompts: the longest of all B rows.
                enc = tokenizer(
                    distinct,
                    return_tensors="pt",
                    padding=True,
                    add_special_tokens=adds_special_tokens(tokenizer),
                ).to(device)
                generated, token_logprobs = decode(
                    model, enc["input_ids"], enc["attention_mask"],  # (U, L)
                    torch.tensor(copies, device=device), warpers=warpers, greedy=temperature == 0,
                    max_new_tokens=max_new_tokens, ends=ends, pad_id=pad_id, logprobs=logprobs,
                )  # (B, T'), T' <= max_new_tokens
                rows_lps = token_logprobs.tolist() if logprobs else [None] * len(generated)
                for row, lps in zip(generated.tolist(), rows_lps):
                    out.append(_to_sample(row, ends, tokenizer, lps))
    finally:
        tokenizer.padding_side = old_side
        model.train(was_training)
    return [out[i * n : (i + 1) * n] for i in range(len(prompts))]


def runs_of_equal(rows: list[str]) -> tuple[list[str], list[int]]:
    """Consecutive equal rows as (distinct rows, how many times each): a prompt's n copies."""
    distinct: list[str] = []
    copies: list[int] = []
    for row in rows:
        if distinct and row == distinct[-1]:
            copies[-1] += 1
        else:
            distinct.append(row)
            copies.append(1)
    return distinct, copies


def sampling_warpers(temperature: float, top_p: float) -> LogitsProcessorList:
    """The logits warpers `generate` builds for `sampling_generation_config`'s settings, in its
    order (transformers `_get_logits_processor`: temperature unless 1, top_p unless 1; top_k
    is 0, i.e. off); none for greedy."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopPLogitsWarper,
    )

    warpers = LogitsProcessorList()
    if temperature == 0:
        return warpers
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1))
    return warpers


def takes_logits_to_keep(model) -> bool:
    """Whether the model's forward can compute the head at the last positions only (the
    test `generate` makes: `GenerationMixin._supports_logits_to_keep`)."""
    return _forward_takes(type(model), "logits_to_keep")


@functools.cache
def _forward_takes(cls, name: str) -> bool:
    return name in inspect.signature(cls.forward).parameters


def decode(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, copies: torch.Tensor,
           *, warpers: LogitsProcessorList, greedy: bool, max_new_tokens: int, ends: set[int],
           pad_id: int, logprobs: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """New tokens (B, T') for U left-padded prompts (U, L), prompt u repeated copies[u] times,
    and with `logprobs` their log-probs (B, T') under the warped distribution each was drawn
    from (else None: one more pass over the (B, V) scores per token, not paid by default).

    transformers `generate`'s sampling loop (`_sample`, one DynamicCache, float32 scores,
    `softmax` + `multinomial` or `argmax`, finished rows fed the pad token, stop when every
    row has an EOS or after max_new_tokens), except the prefill: it runs on the U distinct
    prompts, then the cache and last-position logits are copied to the B rows. As in
    `generate`, the prefill computes the head at the last position only (`logits_to_keep=1`,
    where the model takes it): the (U, L, V) logits would be ~6 GB at a 152k vocabulary.
    T' is the step at which the last row finished. One host sync per token (the all-
    finished test).
    """
    from transformers import DynamicCache

    expand = torch.repeat_interleave(torch.arange(len(copies), device=copies.device),
                                     copies)  # (B,) row -> its prompt
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    last_only = {"logits_to_keep": 1} if takes_logits_to_keep(model) else {}
    out = model(input_ids=input_ids, past_key_values=cache, attention_mask=attention_mask,
                use_cache=True, return_dict=True, **last_only)
    logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)[expand]  # (B, V)
    del out
    cache.reorder_cache(expand)  # every layer's (U, heads, L, d) keys/values -> (B, ...)
    mask = attention_mask[expand]  # (B, L)
    eos = torch.tensor(sorted(ends), device=input_ids.device)
    unfinished = torch.ones(len(expand), dtype=torch.long, device=input_ids.device)  # (B,)
    tokens, token_lps = [], []
    for t in range(max_new_tokens):
        scores = warpers(None, logits)  # the warpers read the scores only
        if greedy:
            next_tokens = torch.argmax(scores, dim=-1)
        else:
            next_tokens = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
        if logprobs:
            token_lps.append(torch.log_softmax(scores, dim=-1).gather(-1, next_tokens[:, None])[:, 0])
        next_tokens = next_tokens * unfinished + pad_id * (1 - unfinished)  # (B,)
        tokens.append(next_tokens)
        unfinished = unfinished & ~torch.isin(next_tokens, eos)
        if t + 1 == max_new_tokens or unfinished.max() == 0:  # syncs with the host
            break
        mask = torch.cat([mask, mask.new_ones((len(mask), 1))], dim=-1)  # (B, L + t + 1)
        out = model(input_ids=next_tokens[:, None], past_key_values=cache,
                    attention_mask=mask, use_cache=True, return_dict=True)
        logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)  # (B, V)
        del out
    return torch.stack(tokens, dim=1), torch.stack(token_lps, dim=1) if logprobs else None


def prefill_shared(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   position_ids: torch.Tensor, prompt_of: torch.Tensor):
    """Run `model` (a causal LM or its backbone) once on U distinct left-padded prompts
    (U, P) into a fresh KV cache, then copy the cache to the B rows (`prompt_of` (B,): each
    row's prompt). Returns the prompts' output (U, P, ...) and the (B,)-row cache, on which
    the rows' own tokens then run: U*P prompt positions instead of B*P. The cache keeps the
    autograd graph, so gradients reach each prompt from every row that shares it."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                past_key_values=cache, use_cache=True)
    cache.reorder_cache(prompt_of)  # every layer's (U, heads, P, d) keys/values -> (B, ...)
    return out, cache


def _to_sample(row: list[int], ends: set[int], tokenizer,
               logprobs: list[float] | None = None) -> Sample:
    """Cut a generated row (and its log-probs) after its first EOS (what follows is padding)."""
    stop = next((i for i, t in enumerate(row) if t in ends), None)
    ids = row if stop is None else row[: stop + 1]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    return Sample(token_ids=ids, text=text, finish_reason="length" if stop is None else "stop",
                  logprobs=None if logprobs is None else logprobs[: len(ids)])


@register_engine
class HFEngine(Engine):
    """transformers `generate` on a model held in this process (the training model for
    rollouts, so pushing weights is a no-op; a loaded checkpoint for evaluation)."""

    name = "hf"

    def __init__(self, model, tokenizer, *, batch_size: int = 64, progress: bool = False,
                 checkpoint: Path | None = None, autocast: torch.dtype | None = None,
                 logprobs: bool = False) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.progress = batch_size, progress
        self.checkpoint = checkpoint  # the directory the weights came from, if any
        self.autocast = autocast  # rollouts: the trainer's compute dtype (hf_generate)
        self.logprobs = logprobs  # Samples carry their tokens' log-probs (measurement)

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

    @classmethod
    def for_rollout(cls, rollout_cfg, model, tokenizer, *, model_path: str, seed: int,
                    compute_dtype: torch.dtype | None = None) -> HFEngine:
        """Rollouts from the training model itself (no copy, no weights to push), under the
        trainer's compute dtype: the log-prob pass recomputes pi_old under
        `torch.autocast(compute_dtype)`, so decoding in the float32 master weights' own
        dtype would sample from another distribution (and move twice the bytes on a GPU)
        while the corrections take mu = pi_old for this engine. verl's HF rollout generates
        under the same autocast as its actor for the same reason."""
        return cls(model, tokenizer, batch_size=rollout_cfg.gen_batch_size,
                   autocast=compute_dtype)

    def generate(self, prompts: list[str], *, n: int, temperature: float, top_p: float,
                 max_new_tokens: int, seed: int) -> list[list[Sample]]:
        return hf_generate(self.model, self.tokenizer, prompts, n=n, temperature=temperature,
                           top_p=top_p, max_new_tokens=max_new_tokens, seed=seed,
                           batch_size=self.batch_size, progress=self.progress,
                           autocast=self.autocast, logprobs=self.logprobs)

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
