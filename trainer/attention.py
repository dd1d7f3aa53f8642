"""`torch_varlen`: padding-free attention on torch's own variable-length kernel, as a
transformers attention implementation (no flash-attn wheel).

    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="torch_varlen")

A padding-free micro-batch (trainer.logprobs `_packed_states`) is one row of concatenated
sequences whose position ids restart at 0 at each sequence's start. transformers hands a
registered attention function that row with no mask (this module's mask function returns
None there, so no dense N x N block mask is ever built) and the position ids; the function
cuts the row where they restart and attends within each piece, causally:

- on a GPU in bf16/fp16: `torch.nn.attention.varlen.varlen_attn(q, k, v, cu_seq, cu_seq,
  max_len, max_len, scale=..., window_size=(-1, 0))` (causal is `window_size == (-1, 0)`,
  torch >= 2.11), with `enable_gqa=True` where the installed torch has it (2.12) and the
  key/value heads repeated where it does not;
- elsewhere (CPU, float32/float64): the exact fallback, one causal sdpa per piece, so the
  padding-free tests against the padded batch cover the same function.

Anything else (a padded batch with its 2-D mask, decoding with a KV cache, the shared-prompt
pass) is not padding-free and goes to transformers' own sdpa path with sdpa's mask: the
same model can generate and compute padded log-probs. Why this and not flex_attention or
FlashAttention-2: docs/performance.md "Padding-free attention on a GPU".

Legend: N tokens of the packed row, S pieces (sequences), Hq query and Hkv key/value heads,
D head dim.
"""

from __future__ import annotations

import inspect

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "torch_varlen"
KERNEL_DTYPES = (torch.bfloat16, torch.float16)  # the flash kernel behind varlen_attn


try:  # imported here, not on first use: it registers the torch_attn ops selective
    # checkpointing's policy looks up (trainer.parallelize)
    from torch.nn.attention.varlen import varlen_attn as _varlen_attn
except ImportError:  # a torch before varlen_attn
    _varlen_attn = None


def kernel():
    """torch's `varlen_attn`, or None where the installed torch has none (before 2.11)."""
    if _varlen_attn is None or "window_size" not in inspect.signature(_varlen_attn).parameters:
        return None
    return _varlen_attn


def uses_kernel(query: torch.Tensor) -> bool:
    """The decision: the CUDA kernel for bf16/fp16 on a GPU, the exact fallback otherwise."""
    return query.is_cuda and query.dtype in KERNEL_DTYPES and kernel() is not None


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


def _attend_kernel(q, k, v, cu_seq, max_len, scale, gqa_groups):
    """q (N, Hq, D), k/v (N, Hkv, D) -> (N, Hq, D) through torch's varlen kernel."""
    varlen_attn = kernel()
    kwargs = {"scale": scale, "window_size": (-1, 0)}  # a tuple: causal is `== (-1, 0)`
    if gqa_groups > 1:
        if "enable_gqa" in inspect.signature(varlen_attn).parameters:
            kwargs["enable_gqa"] = True
        else:  # torch 2.11: one key/value head per query head
            k, v = k.repeat_interleave(gqa_groups, dim=1), v.repeat_interleave(gqa_groups, dim=1)
    return varlen_attn(q, k, v, cu_seq, cu_seq, max_len, max_len, **kwargs)


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
    cu_seq, max_len = pieces(kwargs.get("position_ids"), B, L, device)
    # (B, H, L, D) -> (B * L, H, D): the rows one after another, as the pieces count them
    q, k, v = (x.transpose(1, 2).reshape(B * L, x.shape[1], D) for x in (query, key, value))
    groups = Hq // key.shape[1]
    scale = scaling if scaling is not None else D**-0.5
    if uses_kernel(q):
        out = _attend_kernel(q, k, v, cu_seq, max_len, scale, groups)
    else:
        out = _attend_pieces(q, k, v, cu_seq, scale, groups)
    return out.reshape(B, L, Hq, D), None


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
