"""Samplers: n completions per prompt from an HF model (transformers) or vLLM, one interface.

    sampler = get_sampler("hf", "results/x/checkpoints/step_40", device="cpu")
    prompts = [build_prompt(p, "dapo", sampler.tokenizer) for p in problems]
    samples = sampler.sample(prompts, n=4, temperature=1.0, top_p=1.0,
                             max_new_tokens=256, seed=0)   # list (prompts) of list (n) Sample

`hf_generate` is also the trainer's rollout engine on its in-memory model, so it does no
file I/O. vLLM is imported lazily (not installable on CPU-only machines); its path builds
one ``SamplingParams(n=..., max_tokens=...)`` per prompt set. ``max_new_tokens`` is always
explicit: vLLM's default ``max_tokens`` of 16 silently truncates reasoning.

Legend: P prompts, n samples per prompt, B rows per generate call, L prompt length (padded),
T new tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

BACKENDS = ("hf", "vllm")
FINISH_REASONS = ("stop", "length")
# Files any of which means "a tokenizer is saved here" (fast, sentencepiece, or legacy BPE).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


@dataclass
class Sample:
    """One sampled response."""

    token_ids: list[int]  # response tokens only (EOS included if generated; no padding)
    text: str  # decoded response, special tokens skipped
    finish_reason: str  # "stop" (EOS) | "length" (hit max_new_tokens)


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
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)
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
        with torch.random.fork_rng(devices=cuda_devices), torch.no_grad():
            torch.manual_seed(seed)
            starts = range(0, len(rows), batch_size)
            for start in tqdm(starts, desc="generate", disable=not progress, unit="batch"):
                enc = tokenizer(
                    rows[start : start + batch_size],
                    return_tensors="pt",
                    padding=True,
                    add_special_tokens=add_special_tokens,
                ).to(device)
                sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p}
                generated = model.generate(
                    input_ids=enc["input_ids"],  # (B, L)
                    attention_mask=enc["attention_mask"],
                    max_new_tokens=max_new_tokens,
                    pad_token_id=pad_id,
                    eos_token_id=sorted(eos_ids),
                    use_cache=True,
                    **(sampling if temperature > 0 else {"do_sample": False}),
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


def vllm_sampling_params(n: int, temperature: float, top_p: float, max_new_tokens: int, seed: int):
    """`vllm.SamplingParams` for n samples per prompt; max_tokens is always explicit."""
    _check_sampling(n, temperature, top_p, max_new_tokens)
    from vllm import SamplingParams

    return SamplingParams(
        n=n,
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_new_tokens,
        seed=seed,
        skip_special_tokens=True,
    )


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
            samples.append(Sample(list(completion.token_ids), completion.text, reason))
        result.append(samples)
    return result


class VLLMSampler:
    """Sampler over a vLLM engine (GPU). Prompts are tokenized here with the same rule as
    `hf_generate`, so chat-formatted text does not get a second BOS."""

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
        from vllm import LLM

        path = check_checkpoint(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.llm = LLM(
            model=str(path),
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            tensor_parallel_size=tensor_parallel_size,
            seed=seed,
        )
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
        add_special = not getattr(self.tokenizer, "chat_template", None)
        requests = [
            {"prompt_token_ids": self.tokenizer(p, add_special_tokens=add_special)["input_ids"]}
            for p in prompts
        ]
        outputs = self.llm.generate(requests, params, use_tqdm=self.progress)
        return vllm_outputs_to_samples(outputs)


def get_sampler(backend: str, model_path: str | Path, **kwargs):
    """An `HFSampler` or `VLLMSampler` for `model_path`; kwargs go to its constructor."""
    if backend == "hf":
        return HFSampler(model_path, **kwargs)
    if backend == "vllm":
        return VLLMSampler(model_path, **kwargs)
    raise ValueError(f"backend={backend!r} is not registered; choose one of {list(BACKENDS)}")
