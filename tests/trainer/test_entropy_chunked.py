"""The entropy bonus on the chunked head path: exact value and gradient (float64) against
the full-logits entropy, no vocabulary-wide tensor kept for backward, and the trainer's
update carrying -entropy_coef * token-mean(H) into the gradient."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from algorithms import LossConfig, compute_policy_loss
from trainer.logprobs import head_logprobs, naive_response_logprobs, pack, response_logprobs
from trainer.loop import Trainer

N, H, V, CHUNK, TEMP = 7, 4, 11, 2, 0.7


def _head_case():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(N, H, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(V, H, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(V, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, V, (N,), generator=g)
    c = torch.randn(N, generator=g, dtype=torch.float64)  # a weight per row's entropy
    return h, w, b, t, c


def test_chunked_entropy_value_and_gradient_are_exact_in_float64():
    """H = -sum_k p_k log p_k of z = (h W^T + b) / T; by hand dH/dz_k = -p_k (log p_k + H),
    so d(sum_i c_i H_i)/dh = (c * dH/dz) W / T, /dW = (c * dH/dz)^T h / T, /db = sum / T."""
    h, w, b, t, c = _head_case()
    _, ent = head_logprobs(h, w, t, bias=b, temperature=TEMP, chunk_tokens=CHUNK,
                           with_entropy=True)
    assert ent.dtype == torch.float64  # not rounded through float32
    (c * ent).sum().backward()
    with torch.no_grad():
        z = (h @ w.T + b) / TEMP  # (N, V) the full-vocabulary reference
        logp = torch.log_softmax(z, -1)
        p = logp.exp()
        ref = -(p * logp).sum(-1)
        dz = c[:, None] * (-p * (logp + ref[:, None]))  # (N, V)
    torch.testing.assert_close(ent.detach(), ref, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(h.grad, dz @ w / TEMP, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(w.grad, dz.T @ h.detach() / TEMP, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(b.grad, dz.sum(0) / TEMP, rtol=1e-12, atol=1e-13)


def test_no_vocabulary_wide_tensor_is_kept_for_backward():
    """Every chunk is checkpointed: autograd stores no [rows, V] logits or probabilities
    between forward and backward (they are recomputed per chunk in backward)."""
    h, w, b, t, c = _head_case()
    kept = []

    def pack_hook(x):
        kept.append(tuple(x.shape))
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda x: x):
        lp, ent = head_logprobs(h, w, t, bias=b, chunk_tokens=CHUNK, with_entropy=True)
    (lp.sum() + (c * ent).sum()).backward()
    assert kept, "nothing saved at all: the hook saw no graph"
    assert not [s for s in kept if len(s) == 2 and s[-1] == V], f"vocabulary-wide tensors kept: {kept}"


def _tiny_lm():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V + 20, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=32, tie_word_embeddings=False, pad_token_id=0)
    return LlamaForCausalLM(cfg).double().eval()


def test_entropy_bonus_gradient_through_the_model_equals_the_full_logits_one():
    """float64, whole model, policy loss with an entropy bonus: the chunked head gives the
    gradient of the full-logits (naive) path. (Llama's RMSNorm computes in float32 whatever
    the model's dtype, so two different losses are compared through the same backbone, not
    a difference of two gradients.)"""
    model, coef = _tiny_lm(), 0.3
    batch = pack([[3, 4, 5], [6, 7]], [[8, 9, 10, 11], [12, 13]], pad_id=0)
    mask = batch.response_mask.double()
    adv = torch.tensor([1.0, -0.5], dtype=torch.float64)
    noise = 0.01 * torch.randn(mask.shape, generator=torch.Generator().manual_seed(1),
                               dtype=torch.float64)

    def grads(entropy_coef, naive):
        model.zero_grad()
        lp, ent = (naive_response_logprobs(model, batch, TEMP) if naive else
                   response_logprobs(model, batch, temperature=TEMP, chunk_tokens=CHUNK,
                                     with_entropy=True))
        cfg = LossConfig(objective="reinforce", entropy_coef=entropy_coef)
        loss, _ = compute_policy_loss(cfg, lp, lp.detach() + noise, None, adv, mask,
                                      entropy=ent)
        loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    chunked, naive, plain = grads(coef, False), grads(coef, True), grads(0.0, False)
    for a, b in zip(chunked, naive, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-14)
    moved = sum((a - p).norm() for a, p in zip(chunked, plain)) / sum(p.norm() for p in plain)
    assert moved > 1e-3  # the bonus is a real part of that gradient


def test_trainer_update_adds_the_entropy_bonus_gradient(make_cfg):
    """The trainer's micro-batched update with entropy_coef passes the chunked entropy to the
    loss: its gradient minus the coef-0 one is -coef * grad of the batch's token-mean H."""
    coef = 0.5

    def grads(entropy_coef):
        cfg = make_cfg("ent", method={"name": "RLOO", "loss": {"entropy_coef": entropy_coef}},
                       optim={"micro_batch_size": 5})
        torch.manual_seed(0)
        trainer = Trainer(cfg)
        trainer.setup(track=False)
        batch = trainer.collect().batch
        old, _ = trainer.updater.logprobs_no_grad(trainer.policy, batch, with_entropy=False)
        adv = torch.linspace(-1, 1, batch.input_ids.shape[0])
        trainer.model.zero_grad(set_to_none=True)
        trainer.updater.accumulate_gradients(batch, torch.arange(len(adv)), old, None, adv)
        return trainer, batch, [p.grad.clone() for p in trainer.model.parameters()]

    _, _, plain = grads(0.0)
    trainer, batch, bonus = grads(coef)
    trainer.model.zero_grad(set_to_none=True)
    _, ent = response_logprobs(trainer.model, batch, temperature=trainer.cfg.rollout.temperature,
                               with_entropy=True)
    mask = batch.response_mask
    ((ent * mask).sum() / mask.sum()).backward()
    for a, b, p in zip(bonus, plain, trainer.model.parameters(), strict=True):
        torch.testing.assert_close(a - b, -coef * p.grad, rtol=1e-3, atol=1e-6)
