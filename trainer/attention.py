"""`torch_varlen`: padding-free attention on torch's own variable-length kernel, as a
transformers attention implementation (no flash-attn wheel).

    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="torch_varlen")

A padding-free micro-batch (trainer.logprobs `_packed_states`) is one row of concatenated
sequences whose position ids restart at 0 at each sequence's start. transformers hands a
registered attention function that row with no mask (this module's mask function returns
None there, so no dense N x N block mask is ever built) and the position ids; the function
cuts the row where they restart and attends within each piece, causally:

- on a GPU in bf16/fp16 with a head dim the flash kernel takes (a multiple of 8, at most
  256): `torch.nn.attention.varlen.varlen_attn(q, k, v, cu_seq, cu_seq, max_len, max_len,
  scale=..., window_size=(-1, 0))` (causal is `window_size == (-1, 0)`, torch >= 2.11).
  Grouped-query k/v go unrepeated: 2.12+ is told so (`enable_gqa=True`); 2.11's wrapper has
  no such flag and no head check, and its aten kernel takes Hq a multiple of Hkv natively
  (forward and backward), so the heads are repeated only where a one-time eager probe of
  the kernel refuses grouped heads (`gqa_mode`). The probe runs before any layer does
  (`packing_kwargs`): a try/except around the call inside a compiled layer would be traced
  by Dynamo, not run as a fallback;
- elsewhere (CPU, float32/float64, another head dim): the exact fallback, one causal sdpa
  per piece, so the padding-free tests against the padded batch cover the same function.

The pieces (`cu_seq`, the longest) cost a host sync; the packed forward computes them once
per micro-batch (`packing_kwargs`) and hands them to every layer as transformers'
`cu_seq_lens_q` / `max_length_q` keyword arguments, so a compiled layer has no data-
dependent break and no sync inside.

Anything else (a padded batch with its 2-D mask, decoding with a KV cache, the shared-prompt
pass) is not padding-free and goes to transformers' own sdpa path with sdpa's mask: the
same model can generate and compute padded log-probs. Why this and not flex_attention or
FlashAttention-2: docs/performance.md "Padding-free attention on a GPU".

Legend: N tokens of the packed row, S pieces (sequences), Hq query and Hkv key/value heads,
D head dim.
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "torch_varlen"
KERNEL_DTYPES = (torch.bfloat16, torch.float16)  # the flash kernel behind varlen_attn


MAX_HEAD_DIM = 256  # the flash kernel's limits (aten flash_api.cpp): a multiple of 8, <= 256

try:  # imported here, not on first use: it registers the torch_attn ops selective
    # checkpointing's policy looks up (trainer.parallelize)
    from torch.nn.attention.varlen import varlen_attn as _varlen_attn
except ImportError:  # a torch before varlen_attn
    _varlen_attn = None


@functools.cache
def _parameters(fn) -> frozenset:
    return frozenset(inspect.signature(fn).parameters)


def kernel():
    """torch's `varlen_attn`, or None where the installed torch has none (before 2.11)."""
    if _varlen_attn is None or "window_size" not in _parameters(_varlen_attn):
        return None
    return _varlen_attn


def kernel_fits(on_gpu: bool, dtype: torch.dtype, heads: int, head_dim: int,
                kv_heads: int) -> bool:
    """Whether torch's flash varlen kernel runs these shapes: a GPU, bf16/fp16, a head dim
    that is a multiple of 8 and at most 256, query heads a multiple of the key/value heads;
    otherwise the exact fallback computes (a model outside the limits falls back instead of
    failing inside the kernel, on a GPU only)."""
    return (on_gpu and dtype in KERNEL_DTYPES and kernel() is not None
            and head_dim % 8 == 0 and head_dim <= MAX_HEAD_DIM and heads % kv_heads == 0)


def kernel_device(device: torch.device) -> bool:
    """Whether the flash varlen kernel runs on `device` (CUDA only)."""
    return device.type == "cuda"


def uses_kernel(query: torch.Tensor, kv_heads: int | None = None) -> bool:
    """`kernel_fits` for a query (..., H, D) and its key/value heads (default: as many)."""
    heads, head_dim = query.shape[-2], query.shape[-1]
    return kernel_fits(kernel_device(query.device), query.dtype, heads, head_dim,
                       kv_heads or heads)


def pieces(position_ids: torch.Tensor | None, batch: int, length: int,
           device: torch.device) -> tuple[torch.Tensor, int]:
    """(cu_seq (S + 1,) int32, the longest piece) of the B x L rows flattened into one: a
    piece starts at every row start and wherever the position id does not follow its
    predecessor (a packed sequence's start). One host sync (the longest piece)."""
    starts = torch.zeros(batch, length, dtype=torch.bool, device=device)
    starts[:, 0] = True
    if position_ids is not None:
        pos = position_ids.expand(batch, length)
        starts[:, 1:] |= pos[:, 1:] != pos[:, :-1] + 1
    first = starts.reshape(-1).nonzero().reshape(-1)  # (S,)
    cu_seq = torch.cat([first, first.new_tensor([batch * length])]).to(torch.int32)
    return cu_seq, int(cu_seq.diff().max())


# device type -> how the kernel takes grouped k/v heads: "flag" (enable_gqa, torch 2.12+),
# "native" (2.11's kernel takes them as they are) or "repeat" (a build that refuses them).
# Filled eagerly by `gqa_mode`, read inside compiled layers (a guarded global).
GQA_MODES: dict[str, str] = {}


def _probe_gqa(device: torch.device) -> str:
    """One eager call of the kernel on 2 query heads over 1 key/value head (8 tokens, bf16):
    "native" if it takes them, "repeat" if it raises."""
    q = torch.zeros(8, 2, 8, dtype=torch.bfloat16, device=device)
    kv = torch.zeros(8, 1, 8, dtype=torch.bfloat16, device=device)
    cu_seq = torch.tensor([0, 8], dtype=torch.int32, device=device)
    try:
        kernel()(q, kv, kv, cu_seq, cu_seq, 8, 8, scale=1.0, window_size=(-1, 0))
    except RuntimeError:
        return "repeat"
    return "native"


def gqa_mode(device: torch.device) -> str:
    """How grouped heads reach the kernel on `device` (see GQA_MODES), decided once per
    process and device type, eagerly. Inside a compiled region before any decision (no
    packed forward ran first) it answers "repeat", always correct, and decides nothing."""
    mode = GQA_MODES.get(device.type)
    if mode is not None:
        return mode
    if torch.compiler.is_compiling():
        return "repeat"
    if "enable_gqa" in _parameters(kernel()):
        mode = "flag"
    else:
        mode = _probe_gqa(device)
    GQA_MODES[device.type] = mode
    return mode


def _attend_kernel(q, k, v, cu_seq, max_len, scale, gqa_groups):
    """q (N, Hq, D), k/v (N, Hkv, D) -> (N, Hq, D) through torch's varlen kernel, k/v
    unrepeated unless the kernel refuses grouped heads (see module doc)."""
    kwargs = {"scale": scale, "window_size": (-1, 0)}  # a tuple: causal is `== (-1, 0)`
    if gqa_groups > 1:
        mode = gqa_mode(q.device)
        if mode == "flag":
            kwargs["enable_gqa"] = True
        elif mode == "repeat":  # one key/value head per query head
            k = k.repeat_interleave(gqa_groups, dim=1)
            v = v.repeat_interleave(gqa_groups, dim=1)
    return kernel()(q, k, v, cu_seq, cu_seq, max_len, max_len, **kwargs)


def _attend_pieces(q, k, v, cu_seq, scale, gqa_groups):
    """The exact fallback: q (N, Hq, D), k/v (N, Hkv, D) -> (N, Hq, D), one causal sdpa per
    piece (what the padded batch computes for each row, without its padding)."""
    if gqa_groups > 1:
        k, v = k.repeat_interleave(gqa_groups, dim=1), v.repeat_interleave(gqa_groups, dim=1)
    out = torch.empty_like(q)
    bounds = cu_seq.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        qs, ks, vs = (x[start:end].transpose(0, 1) for x in (q, k, v))  # (H, n, D)
        out[start:end] = torch.nn.functional.scaled_dot_product_attention(
            qs, ks, vs, is_causal=True, scale=scale).transpose(0, 1)
    return out


def varlen_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                             scaling: float | None = None, **kwargs):
    """transformers' attention-function signature: query (B, Hq, L, D), key/value
    (B, Hkv, Lk, D) -> ((B, L, Hq, D), None)."""
    B, Hq, L, D = query.shape
    if attention_mask is not None or key.shape[2] != L:  # padded, or decoding on a cache
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    if dropout:
        raise ValueError(f"{NAME}: attention dropout {dropout} is not supported (the RL "
                         "trainer computes log-probs without dropout); set it to 0")
    if kwargs.get("sliding_window") is not None:
        raise ValueError(f"{NAME}: sliding-window layers are not supported; set "
                         "model.attn_implementation: sdpa for this model")
    device = query.device
    if torch.is_autocast_enabled(device.type):  # rotary may have promoted q, k to float32
        dtype = torch.get_autocast_dtype(device.type)
        query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    cu_seq, max_len = kwargs.get("cu_seq_lens_q"), kwargs.get("max_length_q")
    if cu_seq is None or max_len is None:  # not handed down by the packed forward
        cu_seq, max_len = pieces(kwargs.get("position_ids"), B, L, device)
    # (B, H, L, D) -> (B * L, H, D): the rows one after another, as the pieces count them
    q, k, v = (x.transpose(1, 2).reshape(B * L, x.shape[1], D) for x in (query, key, value))
    groups = Hq // key.shape[1]
    scale = scaling if scaling is not None else D**-0.5
    if uses_kernel(q, key.shape[1]):
        out = _attend_kernel(q, k, v, cu_seq, max_len, scale, groups)
    else:
        out = _attend_pieces(q, k, v, cu_seq, scale, groups)
    return out.reshape(B, L, Hq, D), None


def packing_kwargs(model, position_ids: torch.Tensor) -> dict:
    """What a padding-free forward hands every layer (transformers passes these keyword
    arguments down to the attention function): the pieces of the one packed row (1, N),
    computed here once (one host sync) instead of in every layer. {} for a model that does
    not attend with this implementation. Also where the kernel's GQA support is decided
    (`gqa_mode`), before the first layer runs."""
    if getattr(model.config, "_attn_implementation", None) != NAME:
        return {}
    if kernel() is not None and kernel_device(position_ids.device):
        gqa_mode(position_ids.device)  # decided here, eagerly, before any layer is traced
    cu_seq, max_len = pieces(position_ids, 1, position_ids.shape[-1], position_ids.device)
    return {"cu_seq_lens_q": cu_seq, "cu_seq_lens_k": cu_seq, "max_length_q": max_len,
            "max_length_k": max_len}


def varlen_mask(*args, attention_mask=None, **kwargs):
    """transformers' mask function for this implementation: none where there is no 2-D
    mask (the attention function finds the pieces itself), sdpa's mask otherwise."""
    if attention_mask is None:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def implementations() -> set[str]:
    """Every `attn_implementation` a model can be loaded with here: transformers' registered
    attention functions (this one included) and its built-in eager path."""
    return {"eager", *AttentionInterface._global_mapping}


def register() -> None:
    """Make `attn_implementation="torch_varlen"` loadable (idempotent)."""
    AttentionInterface.register(NAME, varlen_attention_forward)
    AttentionMaskInterface.register(NAME, varlen_mask)


register()
