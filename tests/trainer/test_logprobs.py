"""Chunked log-probs/entropy equal the naive full log-softmax, values and gradients."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from trainer.logprobs import (
    auto_chunk_tokens,
    head_logprobs,
    naive_response_logprobs,
    pack,
    response_logprobs,
)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                      tie_word_embeddings=False, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()


def _batch():
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 97, (n,), generator=g).tolist() for n in (5, 9, 3)]
    responses = [torch.randint(1, 97, (n,), generator=g).tolist() for n in (7, 2, 11)]
    return pack(prompts, responses, pad_id=0)


def test_pack_layout():
    b = pack([[5, 6], [7]], [[1, 2, 3], [4]], pad_id=0)
    assert b.prompt_len == 2
    assert b.input_ids.tolist() == [[5, 6, 1, 2, 3], [0, 7, 4, 0, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [0, 1, 1, 0, 0]]
    assert b.response_mask.tolist() == [[1, 1, 1], [1, 0, 0]]


@pytest.mark.parametrize("chunk", [1, 4, 1024])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_equals_naive(model, chunk, temperature):
    batch = _batch()
    lp, ent = response_logprobs(model, batch, temperature=temperature, chunk_tokens=chunk,
                                with_entropy=True)
    ref_lp, ref_ent = naive_response_logprobs(model, batch, temperature)
    assert lp.shape == batch.response_mask.shape
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    assert (lp[batch.response_mask == 0] == 0).all()
    assert (lp[batch.response_mask == 1] < 0).all()


def test_left_padding_does_not_change_a_sequence(model):
    """A row's log-probs are the same alone or next to a longer, padded neighbour."""
    alone = pack([[3, 4, 5]], [[6, 7]], pad_id=0)
    padded = pack([[3, 4, 5], [8, 9, 10, 11, 12, 13]], [[6, 7], [1, 2, 3, 4]], pad_id=0)
    a, _ = response_logprobs(model, alone)
    b, _ = response_logprobs(model, padded)
    torch.testing.assert_close(a[0, :2], b[0, :2], atol=1e-5, rtol=1e-5)


def test_gradients_match_naive(model):
    batch = _batch()
    weights = torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(2))
    grads = []
    for fn in (lambda: response_logprobs(model, batch, chunk_tokens=3)[0],
               lambda: naive_response_logprobs(model, batch)[0]):
        model.zero_grad()
        (fn() * weights).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_head_logprobs_direct():
    torch.manual_seed(0)
    h, w = torch.randn(10, 8), torch.randn(50, 8)
    t = torch.randint(0, 50, (10,))
    lp, ent = head_logprobs(h, w, t, chunk_tokens=3, with_entropy=True)
    full = torch.log_softmax(h @ w.T, -1)
    torch.testing.assert_close(lp, full.gather(-1, t[:, None]).squeeze(-1))
    torch.testing.assert_close(ent, -(full.exp() * full).sum(-1))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_padding_free_equals_padded_values_and_gradients(model, attn):
    """One concatenated sequence with restarting position ids gives each row exactly its
    padded-batch log-probs, entropies and gradients (no attention across rows)."""
    model.config._attn_implementation = attn
    batch = _batch()
    try:
        outs = {}
        for free in (False, True):
            model.zero_grad()
            lp, ent = response_logprobs(model, batch, with_entropy=True, padding_free=free)
            (lp.sum() + 0.1 * ent.sum()).backward()
            grads = [p.grad.clone() for p in model.parameters()]
            outs[free] = (lp.detach(), ent.detach(), grads)
    finally:
        model.config._attn_implementation = "sdpa"
        model.zero_grad()
    torch.testing.assert_close(outs[True][0], outs[False][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[True][1], outs[False][1], atol=1e-5, rtol=1e-5)
    for g_free, g_padded in zip(outs[True][2], outs[False][2]):
        torch.testing.assert_close(g_free, g_padded, atol=1e-5, rtol=1e-4)
    assert (outs[True][0][batch.response_mask == 0] == 0).all()


def test_bf16_head_weight_gradient_accumulates_in_float32():
    """At Qwen's vocabulary (151,936) with Zipf-repeated targets, the frequent tokens' head
    rows get gradient from every chunk; summed in bf16 over 64 chunks the error is ~1%, cast
    per chunk from the float32 master it stays one bf16 rounding (~0.3%)."""
    V, H, N = 151_936, 16, 2048
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=N,
                      tie_word_embeddings=False, pad_token_id=0)
    m = LlamaForCausalLM(cfg)
    zipf = torch.arange(1, V + 1, dtype=torch.float64) ** -1.1
    targets = torch.multinomial(zipf / zipf.sum(), N, replacement=True,
                                generator=torch.Generator().manual_seed(1))
    batch = pack([[1, 2, 3]] * 4, targets.view(4, -1).tolist(), pad_id=0)
    grads = {}
    for dtype in (None, torch.bfloat16):
        m.zero_grad()
        response_logprobs(m, batch, autocast=dtype)[0].sum().backward()
        assert m.lm_head.weight.grad.dtype == torch.float32
        grads[dtype] = m.lm_head.weight.grad.double()
    rel = (grads[torch.bfloat16] - grads[None]).norm() / grads[None].norm()
    assert rel <= 0.006, f"bf16 head-weight gradient off by {rel:.2%} vs float32"


def test_chunk_rows_sized_for_the_device():
    """GPU chunks hold 2k-8k rows (each chunk re-reads the whole head); CPU keeps ~8 MiB."""
    assert auto_chunk_tokens(151_936, "cuda") == 2048  # 1,766 by memory, the 2k floor
    assert auto_chunk_tokens(65_536, "cuda") == 4096
    assert auto_chunk_tokens(32_000, "cuda") == 8192
    assert auto_chunk_tokens(151_936, "cpu") == 32
    assert auto_chunk_tokens(97, "cpu") == 2**21 // 97
