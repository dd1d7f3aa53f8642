"""One place sets a model up to compute, in one order (as torchtitan's parallelize does):

    1. attention kernel        chosen when the weights load (`model.attn_implementation`;
                               `check_attention` refuses what cannot run before any load)
    2. activation checkpointing `model.gradient_checkpointing`, `model.checkpointing`
    3. compilation             `model.compile`: torch.compile per decoder layer (regional)
    4. FSDP2                   `trainer.distributed.shard` (several ranks), whose bf16
                               policy sees layer inputs already in the compute dtype

    policy = parallelize(model, cfg.model, world, "cuda", torch.bfloat16, train=True)

Checkpointing and compilation act inside each decoder layer, FSDP2 around it; a held
reference or lagged copy is set up the same way without checkpointing (it never runs a
backward). As torchtitan does, each layer's forward is wrapped for checkpointing first and
the layer compiled second, so the compiled graph holds the checkpoint and the selective
policy chooses per op inside it. The other order (transformers' checkpointing around a
compiled layer: checkpoint(compile(layer))) cannot see into inductor's region, so
"selective" recomputed every matmul, exactly as "full" (issue 46). The levers keep the
log-probs and gradients those of the plain path (tests in tests/trainer/test_parallelize.py);
docs/performance.md has what they buy on a GPU.
"""

from __future__ import annotations

import functools
import importlib.util
import types

import torch
import torch.utils.checkpoint

from trainer import attention, distributed
from trainer.logprobs import PolicyLogProbs

CHECKPOINTING = ("full", "selective")


def check_attention(attn_implementation: str | None, device_type: str) -> None:
    """Refuse, before any weights load, an attention implementation that cannot run here:
    flash_attention_2 without its wheel, torch_varlen on a GPU without torch's kernel."""
    if attn_implementation == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        raise ValueError("model.attn_implementation=flash_attention_2 but flash_attn is not "
                         "installed: pip install '.[flash-attn]' on the GPU node, or set "
                         f"model.attn_implementation: {attention.NAME} (torch's own variable-"
                         "length kernel; docs/performance.md)")
    if attn_implementation == attention.NAME and device_type == "cuda" and attention.kernel() is None:
        raise ValueError(f"model.attn_implementation={attention.NAME} needs torch>=2.11 on a GPU "
                         f"(torch.nn.attention.varlen.varlen_attn; this is torch "
                         f"{torch.__version__}): upgrade torch or set "
                         "model.attn_implementation: sdpa")


@functools.cache
def _selective_ops() -> frozenset:
    """The ops whose outputs selective checkpointing keeps: the matmuls and attention
    kernels (the FLOPs). Everything else in a layer (norms, rotary, activations, residual
    adds: memory-bound and cheap) is recomputed in the backward."""
    aten = torch.ops.aten
    names = ("mm", "addmm", "bmm", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
             "_scaled_dot_product_flash_attention_for_cpu")
    ops = {getattr(aten, n).default for n in names if hasattr(aten, n)}
    if hasattr(torch.ops, "torch_attn") and hasattr(torch.ops.torch_attn, "_varlen_attn"):
        ops.add(torch.ops.torch_attn._varlen_attn.default)
    return frozenset(ops)


def _selective_policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    return (CheckpointPolicy.MUST_SAVE if op in _selective_ops()
            else CheckpointPolicy.PREFER_RECOMPUTE)


def checkpoint_kwargs(mode: str) -> dict:
    """`torch.utils.checkpoint.checkpoint` keyword arguments for a checkpointing mode."""
    if mode not in CHECKPOINTING:
        raise ValueError(f"model.checkpointing={mode!r}; choose one of {list(CHECKPOINTING)}")
    kwargs = {"use_reentrant": False}
    if mode == "selective":
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts,
                                                 _selective_policy)
    return kwargs


def decoder_layers(model) -> torch.nn.ModuleList:
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__}: no decoder `layers`")
    return layers


def compile_layers(model) -> None:
    """torch.compile each decoder layer in place (parameter names unchanged): one compiled
    graph reused by every layer, compiled once per shape family (dynamic after the first
    new length)."""
    for layer in decoder_layers(model):
        layer.compile()


def _checkpointed_forward(layer, *args, **kwargs):
    """A decoder layer's forward under `torch.utils.checkpoint` (with its mode's keyword
    arguments, `layer._checkpoint_kwargs`) where autograd records; plain otherwise
    (generation, log-prob passes without grad: nothing to recompute). Bound to the layer
    as a method, so a deep copy of the model binds it to the copy."""
    forward = type(layer).forward
    if not torch.is_grad_enabled():
        return forward(layer, *args, **kwargs)
    return torch.utils.checkpoint.checkpoint(forward, layer, *args, **layer._checkpoint_kwargs,
                                             **kwargs)


def checkpoint_layers(model, mode: str) -> None:
    """Activation checkpointing of each decoder layer's forward, in place (parameter names
    unchanged). The module's hooks (FSDP2's all-gather and input cast) stay outside the
    checkpoint: what enters a recompute is what entered the forward."""
    kwargs = checkpoint_kwargs(mode)
    for layer in decoder_layers(model):
        layer._checkpoint_kwargs = kwargs
        layer.forward = types.MethodType(_checkpointed_forward, layer)


def prepare_layers(model, model_cfg, *, train: bool) -> None:
    """Steps 2 and 3 on `model`'s decoder layers, in place: checkpointing (`train` only: a
    copy that never runs a backward has nothing to recompute), then compilation, which
    compiles the checkpointed forward."""
    ckpt = train and model_cfg.gradient_checkpointing
    if ckpt:
        checkpoint_layers(model, model_cfg.checkpointing)
    if model_cfg.compile:
        compile_layers(model)
        if ckpt and hasattr(torch._C._dynamo.eval_frame, "_set_lru_cache"):
            # as torchtitan: with several cache entries per frame, the recompute may pick
            # another entry than the forward did (pytorch#166926)
            torch._C._dynamo.eval_frame._set_lru_cache(False)


def parallelize(model, model_cfg, world: distributed.World, device_type: str,
                compute_dtype: torch.dtype | None, *, train: bool,
                offload: bool = False) -> PolicyLogProbs:
    """`model` (an HF causal LM) set up per `model_cfg`, as the log-prob module the trainer
    calls: its layers prepared (`prepare_layers`), then sharded when `world` has several
    ranks (decoder layers computing in `compute_dtype`; `offload`: shards on the CPU)."""
    prepare_layers(model, model_cfg, train=train)
    return distributed.shard(PolicyLogProbs(model), world, device_type,
                             param_dtype=compute_dtype, offload=offload)
