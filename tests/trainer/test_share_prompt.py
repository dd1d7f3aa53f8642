"""optim.share_prompt (each distinct prompt through the backbone once, its KV cache copied to
the rows that share it) and optim.whole_groups (mini-batches of whole groups): the same
log-probs, entropies and gradients as the padded batch, and the row orders they promise."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from trainer.logprobs import distinct_prompts, pack, response_logprobs


def _model(dtype=torch.float32):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                      tie_word_embeddings=True, pad_token_id=0)
    return LlamaForCausalLM(cfg).to(dtype).eval()


def _grouped_batch():
    """Three prompts of different lengths, each repeated (a rollout's groups), interleaved
    as a shuffled mini-batch holds them, with responses of different lengths (one of 1)."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 97, (n,), generator=g).tolist() for n in (5, 9, 3)]
    order = [0, 1, 0, 2, 1, 0, 2]
    lengths = [7, 2, 11, 1, 4, 6, 3]
    responses = [torch.randint(1, 97, (n,), generator=g).tolist() for n in lengths]
    return pack([prompts[i] for i in order], responses, pad_id=0), order


def test_distinct_prompts_maps_each_row_to_its_prompt():
    batch, order = _grouped_batch()
    first, prompt_of = distinct_prompts(batch)
    assert len(first) == 3
    # each row's prompt number points at a row with the same prompt, first occurrence
    for row, u in enumerate(prompt_of.tolist()):
        assert order[first[u]] == order[row]
        assert first[u] == order.index(order[row])


def test_values_equal_the_padded_batch_in_float64():
    """Same function: in float64 the log-probs and entropies agree to rounding (1e-12).
    (sdpa: eager attention in float64 turns a left-padded query row into NaN, the mask's
    finfo.min plus a negative score overflowing to -inf, in either path.)"""
    model = _model(torch.float64)
    batch, _ = _grouped_batch()
    with torch.no_grad():
        ref = response_logprobs(model, batch, with_entropy=True)
        got = response_logprobs(model, batch, with_entropy=True, share_prompt=True)
    for a, b in zip(got, ref):
        assert a.dtype == torch.float64
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    assert (got[0][batch.response_mask == 0] == 0).all()


def test_gradients_equal_the_padded_batch():
    """The prompts' keys and values get the gradient of every row that shares them. float64;
    the tolerance is transformers' LlamaRMSNorm, which normalises in float32 whatever the
    model's dtype (measured: 6e-8 of the largest entry, against 4e-16 for the padded batch in two row
    orders), so a last-bit difference upstream of a norm can move a float32 rounding."""
    model = _model(torch.float64)
    batch, _ = _grouped_batch()
    weights = torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(2),
                          dtype=torch.float64)
    grads = {}
    for share in (False, True):
        model.zero_grad()
        lp, ent = response_logprobs(model, batch, with_entropy=True, share_prompt=share)
        ((lp * weights).sum() + 0.1 * ent.sum()).backward()
        grads[share] = [p.grad.clone() for p in model.parameters()]
    for a, b in zip(grads[True], grads[False]):
        assert b.abs().max() > 0
        assert (a - b).abs().max() <= 1e-6 * b.abs().max()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_float32_values_and_gradients_match(attn):
    model = _model()
    model.config._attn_implementation = attn
    batch, _ = _grouped_batch()
    outs = {}
    for share in (False, True):
        model.zero_grad()
        lp, ent = response_logprobs(model, batch, with_entropy=True, share_prompt=share)
        (lp.sum() + 0.1 * ent.sum()).backward()
        outs[share] = (lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()])
    torch.testing.assert_close(outs[True][0], outs[False][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[True][1], outs[False][1], atol=1e-5, rtol=1e-5)
    for a, b in zip(outs[True][2], outs[False][2]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_padding_free_and_share_prompt_are_exclusive():
    batch, _ = _grouped_batch()
    with pytest.raises(ValueError, match="pick one"):
        response_logprobs(_model(), batch, padding_free=True, share_prompt=True)


def test_config_refuses_what_share_prompt_and_whole_groups_cannot_do(make_cfg):
    with pytest.raises(ValueError, match=r"optim.share_prompt .* optim.padding_free"):
        make_cfg(optim={"share_prompt": True, "padding_free": True})
    with pytest.raises(ValueError, match=r"optim.share_prompt .* model.gradient_checkpointing"):
        make_cfg(optim={"share_prompt": True}, model={"gradient_checkpointing": True})
    with pytest.raises(ValueError, match=r"optim.mini_batch_size=6 to be a multiple of "
                                         r"rollout.n=4"):
        make_cfg(optim={"whole_groups": True, "mini_batch_size": 6})


def test_whole_groups_mini_batches_hold_whole_groups(make_cfg):
    """Each mini-batch is a set of whole groups; the epoch covers every row once; the group
    order is seeded per (seed, step, epoch) and differs from the identity."""
    from trainer.update import mini_batch_order

    cfg = make_cfg(rollout={"n": 4, "prompts_per_step": 4},
                   optim={"whole_groups": True, "mini_batch_size": 8})
    seen = set()
    for step in range(1, 7):
        orders = [mini_batch_order(cfg, step, 0, 16, 8) for _ in range(2)]
        assert torch.equal(orders[0], orders[1])
        order = orders[0].tolist()
        assert sorted(order) == list(range(16))
        for start in range(0, 16, 4):  # every run of n rows is one group, in row order
            group = order[start : start + 4]
            assert group[0] % 4 == 0 and group == list(range(group[0], group[0] + 4))
        seen.add(tuple(order))
    assert len(seen) > 1  # shuffled per step (4 groups: 24 orders)


def test_a_run_with_share_prompt_and_whole_groups_learns_like_the_padded_one(make_cfg):
    """Two-step runs with and without share_prompt (whole groups in both): the first step
    samples the same batch, so its loss, KL and gradient norm agree to float32 rounding."""
    from trainer.loop import Trainer

    metrics = {}
    for share in (False, True):
        cfg = make_cfg(f"share{share}", method={"name": "GRPO"},
                       rollout={"dynamic_sampling": False},
                       optim={"steps": 2, "mini_batch_size": 8, "whole_groups": True,
                              "share_prompt": share})
        trainer = Trainer(cfg)
        trainer.setup(track=False)
        metrics[share] = trainer.step()
    a, b = metrics[True], metrics[False]
    assert a["reward_mean"] == b["reward_mean"] and a["response_length_mean"] == b["response_length_mean"]
    for key in ("loss", "grad_norm", "kl_ref_k3", "entropy"):
        assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
