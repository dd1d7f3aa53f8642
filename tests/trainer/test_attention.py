"""`torch_varlen` (trainer.attention): padding-free attention equals the padded batch
exactly on CPU (its per-piece fallback), and on a GPU hands torch's `varlen_attn` the
arguments it needs, checked with a recording stand-in for the kernel."""

from __future__ import annotations

import inspect

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.masking_utils import create_causal_mask

from common.generation.hf import hf_generate
from trainer import attention
from trainer.logprobs import pack, response_logprobs

# GQA on purpose: 4 query heads share 2 key/value heads
CFG = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
           tie_word_embeddings=False, pad_token_id=0)


def _model(dtype=torch.float32, attn="sdpa"):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**CFG, attn_implementation=attn)).to(dtype).eval()


def _batch():
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 97, (n,), generator=g).tolist() for n in (5, 9, 3, 1)]
    responses = [torch.randint(1, 97, (n,), generator=g).tolist() for n in (7, 2, 11, 4)]
    return pack(prompts, responses, pad_id=0)


def _values_and_grads(model, batch, **kwargs):
    model.zero_grad()
    lp, ent = response_logprobs(model, batch, with_entropy=True, **kwargs)
    (lp.sum() + 0.1 * ent.sum()).backward()
    return lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)],
                         ids=["float64", "float32"])
def test_padding_free_varlen_equals_the_padded_sdpa_batch(dtype, tol):
    """Values, entropies and every gradient, with grouped-query heads."""
    batch = _batch()
    padded = _values_and_grads(_model(dtype, "sdpa"), batch)
    free = _values_and_grads(_model(dtype, attention.NAME), batch, padding_free=True)
    torch.testing.assert_close(free[0], padded[0], atol=tol, rtol=tol)
    torch.testing.assert_close(free[1], padded[1], atol=tol, rtol=tol)
    for g_free, g_padded in zip(free[2], padded[2]):
        torch.testing.assert_close(g_free, g_padded, atol=tol, rtol=10 * tol)


def test_padded_batches_and_generation_take_sdpa_with_its_mask():
    """Not padding-free (a 2-D mask, a KV cache): the same model pads and decodes as sdpa."""
    batch = _batch()
    sdpa, varlen = _model(attn="sdpa"), _model(attn=attention.NAME)
    with torch.no_grad():
        a, _ = response_logprobs(sdpa, batch)
        b, _ = response_logprobs(varlen, batch)
    torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-6)

    class Tok:  # hf_generate needs only these of a tokenizer
        pad_token_id, eos_token_id, padding_side = 0, 96, "left"

        def __call__(self, texts, **kw):
            ids = [[int(c) % 90 + 1 for c in t] for t in texts]
            width = max(map(len, ids))
            return _Enc(torch.tensor([[0] * (width - len(x)) + x for x in ids]),
                        torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids]))

        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    outs = [[[s.token_ids for s in group] for group in
             hf_generate(m, Tok(), ["12", "3456"], n=3, temperature=1.0, top_p=1.0,
                         max_new_tokens=6, seed=5)] for m in (sdpa, varlen)]
    assert outs[0] == outs[1]


class _Enc(dict):
    def __init__(self, ids, mask):
        super().__init__(input_ids=ids, attention_mask=mask)

    def to(self, device):
        return self


def test_padding_free_builds_no_dense_mask():
    """transformers would AND a packed-sequence mask into an N x N tensor for sdpa (the 1%
    MFU path); for torch_varlen the mask function returns None and the pieces come from
    the position ids."""
    config = LlamaConfig(**CFG, attn_implementation=attention.NAME)
    embeds = torch.zeros(1, 9, 32)
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    assert create_causal_mask(config, embeds, None, None, position_ids=positions) is None
    config._attn_implementation = "sdpa"
    dense = create_causal_mask(config, embeds, None, None, position_ids=positions)
    assert dense is not None and dense.shape[-2:] == (9, 9)


def test_pieces_start_at_rows_and_position_restarts():
    cu, longest = attention.pieces(torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]]), 1, 9, "cpu")
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 5, 9] and longest == 4
    cu, longest = attention.pieces(torch.tensor([[0, 1, 2], [5, 6, 7]]), 2, 3, "cpu")
    assert cu.tolist() == [0, 3, 6] and longest == 3  # two unpadded rows: one piece each
    cu, _ = attention.pieces(None, 2, 4, "cpu")
    assert cu.tolist() == [0, 4, 8]


def _recorder(calls: list, with_gqa: bool, refuse_groups: bool = False):
    """A stand-in for torch's varlen_attn (2.12's signature, or 2.11's without enable_gqa)
    that records its arguments and computes with the exact fallback; `refuse_groups`: a
    kernel that raises on grouped k/v heads, as a build without native GQA would."""
    def record(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None,
               window_size=(-1, -1), enable_gqa=False):
        calls.append(dict(q=query, k=key, v=value, cu_q=cu_seq_q, cu_k=cu_seq_k, max_q=max_q,
                          max_k=max_k, scale=scale, window_size=window_size,
                          enable_gqa=enable_gqa))
        groups = query.shape[1] // key.shape[1]
        if refuse_groups and groups > 1:
            raise RuntimeError("Number of heads in key/value must equal those of query")
        return attention._attend_pieces(query, key, value, cu_seq_q, scale, groups)

    if with_gqa:
        return record

    def record_211(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None,
                   window_size=(-1, -1)):
        return record(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale,
                      window_size=window_size)
    return record_211


def _kernel_equals_fallback(monkeypatch, kernel):
    """The padding-free log-probs through `kernel` (as on a GPU in bf16) equal the exact
    fallback's, to the bit; returns the model and batch."""
    monkeypatch.setattr(attention, "kernel", lambda: kernel)
    monkeypatch.setattr(attention, "uses_kernel", lambda q, kv=None: True)
    monkeypatch.setattr(attention, "kernel_device", lambda device: True)
    monkeypatch.setattr(attention, "GQA_MODES", {})  # a fresh process: nothing decided
    model, batch = _model(attn=attention.NAME), _batch()
    with torch.no_grad():
        got, _ = response_logprobs(model, batch, padding_free=True)
        monkeypatch.setattr(attention, "uses_kernel", lambda q, kv=None: False)
        want, _ = response_logprobs(model, batch, padding_free=True)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    return model, batch


@pytest.mark.parametrize("with_gqa", [True, False], ids=["torch2.12+", "torch2.11"])
def test_the_gpu_path_hands_varlen_attn_what_it_needs(monkeypatch, with_gqa):
    calls: list = []
    kernel = _recorder(calls, with_gqa)
    assert ("enable_gqa" in inspect.signature(kernel).parameters) == with_gqa
    model, batch = _kernel_equals_fallback(monkeypatch, kernel)
    if not with_gqa:  # 2.11: the one probe on 2 query heads over 1 key/value head first
        probe = calls.pop(0)
        assert probe["q"].shape[1] == 2 and probe["k"].shape[1] == 1
    assert len(calls) == CFG["num_hidden_layers"]
    lengths = (batch.attention_mask.sum(-1)).tolist()  # the packed rows' real tokens
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    layer = model.model.layers[0].self_attn
    for c in calls:
        n = sum(lengths)
        assert c["q"].shape == (n, 4, 8)  # (N, Hq, D)
        # grouped k/v unrepeated: 2.12+ with enable_gqa, 2.11 (no flag) natively
        assert c["k"].shape == c["v"].shape == (n, 2, 8)
        assert c["enable_gqa"] is with_gqa
        assert c["cu_q"].dtype == torch.int32 and torch.equal(c["cu_q"], cu)
        assert c["cu_k"] is c["cu_q"]
        assert c["max_q"] == c["max_k"] == max(lengths) and isinstance(c["max_q"], int)
        assert c["window_size"] == (-1, 0) and isinstance(c["window_size"], tuple)  # causal
        assert c["scale"] == layer.scaling


def test_a_211_kernel_that_refuses_grouped_heads_gets_them_repeated(monkeypatch):
    """The probe (1 key/value head) is refused once, before the layers; every layer then
    calls the kernel once, its heads repeated: no call raises inside a layer."""
    calls: list = []
    _kernel_equals_fallback(monkeypatch, _recorder(calls, False, refuse_groups=True))
    assert [c["k"].shape[1] for c in calls] == [1] + [4] * CFG["num_hidden_layers"]
    assert attention.GQA_MODES == {"cpu": "repeat"}


@pytest.mark.parametrize("refuse", [False, True], ids=["native", "refused"])
def test_gqa_is_decided_before_a_compiled_layer_is_traced(monkeypatch, refuse):
    """Layers compiled whole (fullgraph): the decision is made by the packed forward before
    them, eagerly, so the traced layer holds one kernel call with the heads it decided, and
    a kernel that refuses grouped heads never raises inside the layer."""
    def kernel(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None,
               window_size=(-1, -1)):  # torch 2.11's signature: no enable_gqa
        groups = query.shape[1] // key.shape[1]
        if refuse and groups > 1:
            raise RuntimeError("Number of heads in key/value must equal those of query")
        return attention._attend_pieces(query, key, value, cu_seq_q, scale, groups)

    monkeypatch.setattr(attention, "kernel", lambda: kernel)
    monkeypatch.setattr(attention, "uses_kernel", lambda q, kv=None: True)
    monkeypatch.setattr(attention, "kernel_device", lambda device: True)
    monkeypatch.setattr(attention, "GQA_MODES", {})
    model, batch = _model(attn=attention.NAME), _batch()
    with torch.no_grad():
        want, _ = response_logprobs(model, batch, padding_free=True)
        monkeypatch.setattr(attention, "GQA_MODES", {})
        torch._dynamo.reset()
        for layer in model.model.layers:
            layer.compile(backend="eager", fullgraph=True)
        got, _ = response_logprobs(model, batch, padding_free=True)
    assert attention.GQA_MODES == {"cpu": "repeat" if refuse else "native"}
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_the_pieces_are_found_once_per_forward_not_per_layer(monkeypatch):
    """One host sync per micro-batch: the packed forward hands the pieces to every layer
    (transformers' cu_seq_lens_q / max_length_q keyword arguments)."""
    found = []
    real = attention.pieces

    def counting(*args):
        found.append(args)
        return real(*args)

    monkeypatch.setattr(attention, "pieces", counting)
    model, batch = _model(attn=attention.NAME), _batch()
    with torch.no_grad():
        response_logprobs(model, batch, padding_free=True)
    assert len(found) == 1 and CFG["num_hidden_layers"] > 1


def test_under_autocast_the_kernel_gets_the_compute_dtype(monkeypatch):
    """Rotary in float32 can promote q and k past autocast; the kernel takes one dtype."""
    calls: list = []
    monkeypatch.setattr(attention, "kernel", lambda: _recorder(calls, True))
    monkeypatch.setattr(attention, "uses_kernel", lambda q, kv=None: True)
    with torch.no_grad():
        response_logprobs(_model(attn=attention.NAME), _batch(), padding_free=True,
                          autocast=torch.bfloat16)
    assert calls and all(c[x].dtype == torch.bfloat16 for c in calls for x in "qkv")


def test_uses_the_kernel_only_where_it_runs(monkeypatch):
    assert not attention.uses_kernel(torch.zeros(2, 2, 2, dtype=torch.bfloat16))  # CPU
    assert not attention.uses_kernel(torch.zeros(2, 2, 2))
    monkeypatch.setattr(attention, "kernel", lambda: object())  # as where torch has it
    fits = attention.kernel_fits
    assert fits(True, torch.bfloat16, 32, 128, 8) and fits(True, torch.float16, 16, 256, 16)
    assert fits(True, torch.bfloat16, 14, 72, 2)  # a multiple of 8, not of 16
    assert not fits(True, torch.bfloat16, 32, 60, 8)  # head dim not a multiple of 8
    assert not fits(True, torch.bfloat16, 32, 264, 8)  # above 256
    assert not fits(True, torch.bfloat16, 6, 64, 4)  # heads not a multiple of kv heads
    assert not fits(True, torch.float32, 32, 128, 8) and not fits(False, torch.bfloat16, 32, 128, 8)


def test_dropout_and_sliding_windows_are_refused():
    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError, match="dropout"):
        attention.varlen_attention_forward(None, q, q, q, None, dropout=0.1)
    with pytest.raises(ValueError, match="sliding-window"):
        attention.varlen_attention_forward(None, q, q, q, None, sliding_window=4)
