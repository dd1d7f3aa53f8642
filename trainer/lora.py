"""LoRA adapters on the policy (`model.lora`), built with peft: what trains, what the reference
is without a copy, and what the adapted weights are to a reader that knows no peft.

    model = apply_lora(model, cfg.model.lora)     # peft swaps the target linears in place;
                                                  # `model` stays the HF model, now adapted
    with adapters_off(model): ...                 # the base model (GRPO's fixed reference)
    snap = adapter_snapshot(model)                # the adapters alone (every_k, kl_target)
    with adapters_from(model, snap): ...          # the policy with those adapters

Only the adapters train (peft freezes the rest; the optimizer gets only them, float32 even
over bf16 base weights). The merged weights W + scaling * B @ A, under the HF names, are what
checkpoints hold (`common.generation.base.model_weights`): evaluation and lighteval need no
peft. A vLLM rollout engine gets the base once and the float32 adapters after every update
(`rollout.vllm_lora: adapters`, common.generation.vllm): a bf16 merge would round an early,
small update away. Why LoRA leaves every surrogate's exactness as it was:
docs/algorithms.md "LoRA".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch

from common.generation.base import full_tensor, model_weights

ADAPTER_DIR = "adapter"  # inside an HF checkpoint: the adapters beside the merged weights


def lora_layers(model) -> list[torch.nn.Module]:
    """peft's LoRA layers of `model` (modules with a base layer and lora_A/lora_B)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


def decoder_linears(model) -> dict[str, torch.nn.Module]:
    """Every linear layer inside the decoder's layers, by its full module name (a base
    layer's name once adapted): what adapters may target. Not the LM head (the chunked head
    trains no adapter) nor the embeddings (peft gives them other parameters, which the
    merge, the snapshot and `adapter/` would drop)."""
    decoder, out = model.get_decoder(), {}
    inside = {id(m) for layer in getattr(decoder, "layers", []) for m in layer.modules()}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and id(m) in inside and ".lora_" not in name:
            out[name.removesuffix(".base_layer")] = m
    return out


def linear_names(model) -> list[str]:
    """The last name of every linear layer of `model`'s decoder (what target_modules match)."""
    return sorted({n.rsplit(".", 1)[-1] for n in decoder_linears(model)})


def check_targets(model, config, targets) -> None:
    """Refuse `targets` (the user's model.lora.target_modules; `config` the LoraConfig made
    of them) outside the decoder's linear layers (lm_head, embed_tokens, a norm), and
    targets that match nothing, in one line naming the key and the choices."""
    from peft.tuners.tuners_utils import check_target_module_exists

    if targets == "all-linear":  # peft's own rule: every linear layer but the output head
        return
    allowed = decoder_linears(model)
    hits = [name for name, _ in model.named_modules() if check_target_module_exists(config, name)]
    outside = [name for name in hits if name not in allowed]
    if outside:
        raise ValueError(f"model.lora.target_modules={targets!r} matches {outside[:3]}: only "
                         f"linear layers inside the decoder's layers take adapters "
                         f"({linear_names(model)}, or all-linear)")
    if not hits:
        raise ValueError(f"model.lora.target_modules={targets!r} matches no module of "
                         f"{type(model).__name__}; its decoder's linear layers are "
                         f"{linear_names(model)} (or use all-linear)")


def apply_lora(model, settings):
    """Inject LoRA adapters (`settings`: trainer.config.LoraSettings) into `model` in place and
    return the peft wrapper (for saving the adapters); `model` itself is now adapted. A
    target outside the decoder's linear layers, or one that matches nothing, is a
    ValueError naming the key and the choices (`check_targets`)."""
    from peft import LoraConfig, get_peft_model

    targets = settings.target_modules
    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=targets, task_type="CAUSAL_LM", bias="none")
    check_targets(model, config, targets)
    # peft's default init: B = 0, so the adapted model starts as the base, bit for bit;
    # autocast_adapter_dtype keeps the adapters float32 over bf16 base weights
    return get_peft_model(model, config, autocast_adapter_dtype=True)


def trainable(model) -> list[torch.nn.Parameter]:
    """The parameters an optimizer updates (the adapters under LoRA, all otherwise)."""
    return [p for p in model.parameters() if p.requires_grad]


@contextlib.contextmanager
def adapters_off(model) -> Iterator[None]:
    """Inside: `model` computes as its base model (every adapter disabled). Forwards only
    (peft marks the disabled adapters' parameters as not requiring grad meanwhile)."""
    layers = lora_layers(model)
    try:
        for layer in layers:
            layer.enable_adapters(False)
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def adapter_parameters(model) -> dict[str, torch.nn.Parameter]:
    """name -> parameter of every adapter weight (lora_A / lora_B), in module order."""
    return {n: p for n, p in model.named_parameters() if ".lora_A." in n or ".lora_B." in n}


@torch.no_grad()
def adapter_snapshot(model) -> dict[str, torch.Tensor]:
    """A copy of the adapters alone (under FSDP2: this rank's shards): the held part of a
    refreshed reference, ~rank x (in + out) numbers per adapted layer."""
    return {n: p.detach().clone() for n, p in adapter_parameters(model).items()}


@contextlib.contextmanager
def adapters_from(model, snapshot: dict[str, torch.Tensor]) -> Iterator[None]:
    """Inside: `model`'s adapters hold `snapshot`'s values; on exit the trained ones are
    restored bit for bit (copied aside first). Forwards only."""
    params = adapter_parameters(model)
    with torch.no_grad():
        saved = {n: p.detach().clone() for n, p in params.items()}
    try:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(snapshot[n])
        yield
    finally:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(saved[n])


def load_snapshot(snapshot: dict[str, torch.Tensor], values: dict[str, torch.Tensor]) -> None:
    """Copy saved adapter values into a snapshot in place (the resume state's)."""
    with torch.no_grad():
        for n, t in snapshot.items():
            t.copy_(values[n])


def checkpoint_parts(model, keep: bool, dtype: torch.dtype | None = None) -> tuple[dict, dict]:
    """(the merged weights under the plain HF names, the adapters under peft's names) of
    `model`, each gathered whole one tensor at a time (collectives under FSDP2: every rank
    calls this), kept on the CPU where `keep` (rank 0, the writer), else {} and {}. The
    merge is made in `dtype` (the save dtype; None: the weights' own), so a float32 save
    over bf16 base weights keeps the adapters' update instead of its bf16 rounding."""
    merged, adapters = {}, {}
    for name, t in model_weights(model, dtype=dtype):
        if keep:
            merged[name] = t.cpu()
    for name, p in adapter_parameters(model).items():
        whole = full_tensor(p)
        if keep:
            adapters[f"base_model.model.{name}"] = whole.cpu()
    return merged, adapters


def adapter_writer(peft_model, adapters: dict):
    """A function writing the adapters (peft's `adapter_model.safetensors` and
    `adapter_config.json`) into a checkpoint folder's ADAPTER_DIR."""
    def write(folder: Path) -> None:
        # save_embedding_layers="auto" (peft's default) asks the Hub whether the base model's
        # config exists when model.path is not a local folder: a stall on an offline node
        peft_model.save_pretrained(Path(folder) / ADAPTER_DIR, state_dict=adapters,
                                   save_embedding_layers=False)
    return write
