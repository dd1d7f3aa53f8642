"""`rollout.mask_truncated`: responses cut at max_new_tokens carry no loss weight and leave
the token-mean's token count (TRL's mask_truncated_completions); the rest is unchanged."""

from __future__ import annotations

import torch

from trainer.loop import Trainer
from trainer.update import Updater, loss_batch

# 8 new tokens: the test model finishes about a quarter of its responses, the rest are cut
ROLLOUT = {"max_new_tokens": 8, "overlong_buffer": 4}


def _trainer(make_cfg, **rollout):
    cfg = make_cfg("mask", rollout={**ROLLOUT, **rollout}, method={"name": "RLOO"})
    torch.manual_seed(0)
    trainer = Trainer(cfg)
    trainer.setup(track=False)
    return trainer


def _grads(trainer, batch, rows, old, adv):
    trainer.model.zero_grad(set_to_none=True)
    loss, _ = trainer.updater.accumulate_gradients(batch, rows, old, None, adv)
    return loss, [p.grad.clone() for p in trainer.model.parameters()]


def test_truncated_rows_add_no_gradient_and_no_tokens(make_cfg):
    """The masked update's gradient is exactly the update on the finished rows alone (whose
    token-mean divides by the finished rows' tokens only), and differs from the unmasked."""
    trainer = _trainer(make_cfg)
    rollout = trainer.collect()
    batch, cut = rollout.batch, rollout.truncated
    eos = trainer.tokenizer.eos_token_id
    lengths = batch.response_lengths
    last = batch.response_ids[torch.arange(len(lengths)), (lengths - 1).clamp_min(0)]
    # the engine's finish reason: cut = hit the budget without its end-of-sequence token
    assert torch.equal(cut, (lengths == ROLLOUT["max_new_tokens"]) & (last != eos))
    assert 0 < int(cut.sum()) < len(cut), "the case needs finished and cut responses"
    old, _ = trainer.updater.logprobs_no_grad(trainer.policy, batch, with_entropy=False)
    with torch.no_grad():  # off the sampler, so that every token's gradient differs
        for p in trainer.model.parameters():
            p.add_(1e-2 * torch.randn_like(p))
    adv = torch.linspace(-1, 1, len(cut))
    everything = torch.arange(len(cut))
    masked_loss, masked = _grads(trainer, loss_batch(batch, cut, True), everything, old, adv)
    kept_loss, kept = _grads(trainer, batch, everything[~cut], old, adv)
    plain_loss, plain = _grads(trainer, loss_batch(batch, cut, False), everything, old, adv)
    torch.testing.assert_close(masked_loss, kept_loss, rtol=1e-6, atol=1e-8)
    for a, b in zip(masked, kept, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)
    assert sum((a - b).norm() for a, b in zip(masked, plain)) > 1e-3 * sum(
        b.norm() for b in plain)
    assert loss_batch(batch, cut, False) is batch  # off: the very same batch


def test_the_update_sees_the_masked_batch_only_when_asked(make_cfg, monkeypatch):
    seen = {}
    real_update = Updater.update

    def spy(self, batch, *args):
        seen["mask"] = batch.response_mask.clone()
        return real_update(self, batch, *args)

    monkeypatch.setattr(Updater, "update", spy)
    for on in (False, True):
        trainer = _trainer(make_cfg, mask_truncated=on)
        rollout = trainer.collect()
        trainer.learn(rollout, {})
        cut = rollout.truncated
        full = rollout.batch.response_mask
        assert torch.equal(seen["mask"][~cut], full[~cut])  # finished rows untouched
        assert (seen["mask"][cut] == 0).all() == on and cut.any()
