"""The engine interface every generation backend implements, and what they share.

An engine holds a model and a tokenizer and answers one question: n completions per prompt
under (temperature, top_p, max_new_tokens, seed). The trainer uses it for rollouts (weights
pushed in after every update, sleeping between rollouts where the engine can), evaluation
for checkpoints (weights swapped per checkpoint, one start-up for many). Both sample from
exactly the distribution the trainer's log-probs assume: softmax(logits / temperature) cut
by top_p and nothing else; a checkpoint's generation_config.json sampling defaults are
ignored.

Legend: P prompts, n samples per prompt.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from algorithms.registry import Registry

FINISH_REASONS = ("stop", "length")
# Files any of which means "a tokenizer is saved here" (fast, sentencepiece, or legacy BPE).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
# config.json keys that must agree between checkpoints swapped into one engine: the shapes.
ARCHITECTURE_KEYS = ("architectures", "model_type", "vocab_size", "hidden_size",
                     "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                     "intermediate_size", "tie_word_embeddings")

Weights = Iterable[tuple[str, torch.Tensor]]  # (HF state-dict name, tensor), one at a time


@dataclass
class Sample:
    """One sampled response."""

    token_ids: list[int]  # response tokens only (EOS included if generated; no padding)
    text: str  # decoded response, special tokens skipped
    finish_reason: str  # "stop" (EOS) | "length" (hit max_new_tokens)
    # The engine's log-prob of each response token under the distribution it sampled from
    # (vLLM; None from transformers, whose sampler is the training model itself).
    logprobs: list[float] | None = None


@dataclass(frozen=True)
class EngineOptions:
    """How to start an engine on a checkpoint; each engine reads the fields that apply."""

    dtype: str = "auto"  # auto, float32, bfloat16, float16
    device: str = "auto"  # hf: cpu, cuda, auto
    seed: int = 0  # vllm: the engine's base seed (every request carries its own too)
    batch_size: int = 64  # hf: rows per generate call
    progress: bool = False
    gpu_memory_utilization: float = 0.9  # vllm on GPU
    max_model_len: int | None = None  # vllm
    tensor_parallel_size: int = 1  # vllm


def check_sampling(n: int, temperature: float, top_p: float, max_new_tokens: int) -> None:
    """Reject sampling settings no engine can honour, with the bad value named."""
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 = greedy)")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must be in (0, 1]")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")


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
    check_weights(path)
    return path


def expected_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """{state-dict name: shape} of the model `path/config.json` describes, built on the meta
    device (no memory, no weights); {} when transformers cannot build it from the config
    alone (then the engine's own load is the check)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path / 'config.json'} cannot be read ({exc}); write it again with "
                         "model.save_pretrained(path)") from None
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError, TypeError):
        return {}
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def check_weights(path: Path) -> None:
    """Fail before an engine or the trainer loads them if the weight files are cut short
    (a full disk, a killed copy) or do not fit config.json (another model's weights):
    reads the safetensors headers only, which name every tensor's shape and byte range."""
    from safetensors import SafetensorError, safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} holds no *.safetensors weight files; save the model with "
                         "model.save_pretrained(path)")
    expected = expected_shapes(path)
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
        except (SafetensorError, OSError) as exc:
            raise ValueError(
                f"{file} is not a complete safetensors file ({file.stat().st_size} bytes; "
                f"{exc}): it was cut short (a full disk, a killed save or copy); save or copy "
                "the checkpoint again") from None
        for name, shape in shapes.items():
            want = expected.get(name)
            if want is not None and want != shape:
                raise ValueError(
                    f"{file}: tensor {name} has shape {list(shape)} but "
                    f"{path / 'config.json'} makes it {list(want)}: the weights and config.json "
                    "are from different models; save both from one model (save_pretrained)")


def architecture(path: str | Path) -> dict:
    """The shape-defining entries of a checkpoint's config.json (see ARCHITECTURE_KEYS)."""
    config = json.loads((Path(path) / "config.json").read_text())
    return {k: config.get(k) for k in ARCHITECTURE_KEYS}


def check_same_architecture(loaded: str | Path, other: str | Path) -> None:
    """Refuse to swap `other`'s weights into an engine started on `loaded` when the shapes
    differ (another model, not another step of the same run)."""
    a, b = architecture(loaded), architecture(other)
    diff = {k: (a[k], b[k]) for k in ARCHITECTURE_KEYS if a[k] != b[k]}
    if diff:
        raise ValueError(f"checkpoint {other} is not the architecture of {loaded} (config.json "
                         f"differs: {diff}); evaluate checkpoints of one model per process")


def checkpoint_weights(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs of an HF checkpoint's weight files, one file at a time.

    With tied input/output embeddings `save_pretrained` writes the embedding once; the head
    is yielded under `lm_head.weight` too, so an engine that keeps a separate head copy
    (vLLM on CPU does) receives it.
    """
    from safetensors.torch import load_file

    path = Path(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} holds no *.safetensors weight files")
    tied = bool(architecture(path).get("tie_word_embeddings"))
    names = set()
    embed = None
    for file in files:
        for name, tensor in load_file(file).items():
            names.add(name)
            if name.endswith("embed_tokens.weight"):
                embed = tensor
            yield name, tensor
    if tied and "lm_head.weight" not in names and embed is not None:
        yield "lm_head.weight", embed


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """One whole tensor: under FSDP2 a sharded parameter is gathered here, one at a time
    (a collective: every rank pushes the same names in the same order), never the whole
    model at once."""
    t = t.detach()
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def merged_lora_weight(weight: torch.Tensor, layer,
                       out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """W + scaling * B @ A over a LoRA layer's active adapters (peft's naming: `lora_A`,
    `lora_B` ModuleDicts, `scaling`, `active_adapters`), out of place, in `out_dtype`
    (default W's); each adapter gathered whole (`full_tensor`), so under FSDP2 it is a
    collective too. In bf16 an entry of the update below half a bf16 step of W rounds back
    to W: a merge for a reader of bf16 weights drops the adapters' early update."""
    dtype = torch.promote_types(weight.dtype, torch.float32)  # bf16 up; float64 kept
    merged = weight.to(dtype)
    for name in layer.active_adapters:
        if name in layer.lora_A:
            a, b = full_tensor(layer.lora_A[name].weight), full_tensor(layer.lora_B[name].weight)
            merged = merged + layer.scaling[name] * (b.to(dtype) @ a.to(dtype))
    return merged.to(out_dtype or weight.dtype)


def model_weights(model, merge: bool = True, dtype: torch.dtype | None = None) -> Weights:
    """(HF name, whole tensor) of every weight of `model` as a plain checkpoint names it, one
    at a time: a LoRA layer (peft's `X.base_layer.weight` plus `X.lora_A/B.<adapter>`) gives
    `X.weight` with its adapters merged in (`merged_lora_weight`; `merge=False`: the base
    weight alone, for an engine that serves the adapters itself), and the adapters
    themselves are not given. Without LoRA: the state dict as it is. `dtype`: the merge's
    result dtype (a float32 save of a bf16 base keeps the adapters' update unrounded).
    Under FSDP2 each tensor is gathered here (every rank walks the same names in the same
    order)."""
    layers = {name: m for name, m in model.named_modules()
              if hasattr(m, "base_layer") and hasattr(m, "lora_A") and hasattr(m, "scaling")}
    for name, t in model.state_dict().items():
        if ".lora_" in name:
            continue
        prefix, sep, leaf = name.rpartition(".base_layer.")
        if not sep:
            yield name, full_tensor(t)
        elif leaf == "weight" and prefix in layers and merge:
            yield f"{prefix}.{leaf}", merged_lora_weight(full_tensor(t), layers[prefix], dtype)
        else:  # a base layer's bias (unchanged by LoRA), or its weight unmerged
            yield f"{prefix}.{leaf}", full_tensor(t)


def lora_config(model):
    """The LoraConfig of a peft-adapted HF model (peft leaves `peft_config`, one adapter
    per name, on the model it injects into), or None without adapters."""
    configs = getattr(model, "peft_config", None) or {}
    if len(configs) > 1:
        raise ValueError(f"{type(model).__name__} holds {len(configs)} adapters "
                         f"({sorted(configs)}); an engine serves one")
    return next(iter(configs.values()), None)


def adapter_weights(model) -> Weights:
    """(peft file name, whole tensor) of the active adapter's lora_A/lora_B weights, as
    `PeftModel.save_pretrained` writes them (`base_model.model.<module>.lora_A.weight`),
    gathered one at a time under FSDP2."""
    for name, p in model.named_parameters():
        for part in (".lora_A.", ".lora_B."):
            if part in name:
                module, _, rest = name.partition(part)
                leaf = rest.split(".", 1)[1]  # "<adapter>.weight" -> "weight"
                yield f"base_model.model.{module}{part}{leaf}", full_tensor(p)


def forward_dtype(model, compute_dtype: torch.dtype | None, override: str | None = None) -> str:
    """The engine's dtype option: `override` (`rollout.vllm_dtype`) when given, else the
    training model's forward dtype: the autocast dtype, else the weights' own ("float32",
    "bfloat16", ...)."""
    if override is not None:
        return override
    dtype = compute_dtype or next(model.parameters()).dtype
    return str(dtype).removeprefix("torch.")


class Engine(ABC):
    """n samples per prompt from a causal LM; weights replaceable in place.

    Subclasses set `name` (the registry key, see common.generation) and implement
    `from_checkpoint`, `generate` and `load_weights`. `for_rollout` defaults to starting
    from the run's checkpoint; `sleep`/`wake` default to nothing.
    """

    name: str = ""
    tokenizer = None

    @classmethod
    @abstractmethod
    def from_checkpoint(cls, path: str | Path, options: EngineOptions) -> Engine:
        """Start the engine on an HF checkpoint directory (weights + tokenizer)."""

    @classmethod
    def for_rollout(cls, rollout_cfg, model, tokenizer, *, model_path: str, seed: int,
                    compute_dtype: torch.dtype | None = None) -> Engine:
        """The engine a training run samples from (`rollout_cfg`: the run config's
        trainer.config.RolloutConfig; `model`: the training model). By default the engine
        starts on the run's initial checkpoint in the model's forward dtype; the trainer
        pushes its current weights in at once (`sync_weights`), so any registered engine can
        serve rollouts. Engines with their own set-up (hf: the model itself) override it."""
        options = EngineOptions(dtype=forward_dtype(model, compute_dtype), seed=seed,
                                batch_size=rollout_cfg.gen_batch_size)
        return cls.from_checkpoint(model_path, options)

    @abstractmethod
    def generate(self, prompts: list[str], *, n: int, temperature: float, top_p: float,
                 max_new_tokens: int, seed: int) -> list[list[Sample]]:
        """n samples per prompt: outer list P prompts, inner n samples. Prompts are text
        (already chat-formatted by common.prompts.build_prompt), tokenized with
        common.prompts.adds_special_tokens. Same inputs + seed give the same samples."""

    @abstractmethod
    def load_weights(self, weights: Weights) -> None:
        """Replace the model's weights in place with (HF name, tensor) pairs; no KV cache or
        other state computed under the old weights survives."""

    def sync_weights(self, model) -> None:
        """Push a training model's current weights (every state-dict entry, gathered one
        tensor at a time under FSDP2; LoRA adapters merged in: `model_weights`)."""
        self.load_weights(model_weights(model))

    def load_checkpoint(self, path: str | Path) -> None:
        """Swap in the weights of another checkpoint of the same architecture."""
        path = check_checkpoint(path)
        if getattr(self, "checkpoint", None) is not None:
            check_same_architecture(self.checkpoint, path)
        self.load_weights(checkpoint_weights(path))
        self.checkpoint = path

    def sleep(self) -> None:  # noqa: B027 - optional hook: most engines cannot sleep
        """Release accelerator memory between uses (engines that can)."""

    def wake(self) -> None:  # noqa: B027 - optional hook, see sleep
        """Undo `sleep`."""

    def close(self) -> None:  # noqa: B027 - optional hook: most engines own nothing to end
        """End the engine before the process's distributed group is destroyed."""


# name -> engine class; filled by @register_engine. Every list of engine names is this one.
ENGINES: Registry[type[Engine]] = Registry("engine")


def register_engine(cls: type[Engine]) -> type[Engine]:
    """Class decorator: make `cls` available under `cls.name`."""
    return ENGINES.register(cls.name, cls)
