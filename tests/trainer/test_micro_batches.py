"""Token-budget micro-batches: every row once, within budget, and the same gradient and
log-probs as one unsplit batch."""

from __future__ import annotations

import torch

from trainer.logprobs import balanced_share, micro_batches, pack, padded_tokens
from trainer.loop import Trainer


def _batch(lengths: list[tuple[int, int]]):
    prompts = [list(range(3, 3 + p)) for p, _ in lengths]
    responses = [list(range(5, 5 + t)) for _, t in lengths]
    return pack(prompts, responses, pad_id=0)


def test_token_budget_packs_every_row_once_within_budget():
    lengths = [(4, 30), (6, 2), (5, 12), (4, 29), (3, 1), (6, 8), (5, 3)]
    batch = _batch(lengths)
    rows = torch.arange(len(lengths))
    groups = micro_batches(batch, rows, max_rows=4, max_tokens=40)
    assert sorted(torch.cat(groups).tolist()) == rows.tolist()
    for g in groups:
        sub = batch.rows(g)
        assert len(g) <= 4
        assert len(g) == 1 or sub.input_ids.numel() <= 40  # a lone long row may exceed it
    assert groups[0].tolist() == [0]  # longest first (34 tokens; two would not fit)
    # Fewer padded positions than fixed chunks in order, each trimmed, or the whole batch.
    fixed = micro_batches(batch, rows, max_rows=4)
    assert padded_tokens(batch, groups) < padded_tokens(batch, fixed) < batch.input_ids.numel()


def test_trimmed_rows_keep_the_response_columns():
    batch = _batch([(4, 30), (2, 3)])
    sub = batch.rows(torch.tensor([1]))
    assert sub.prompt_len == 2 and sub.response_mask.shape == (1, 3)
    assert torch.equal(sub.response_ids, batch.response_ids[1:, :3])


def test_token_budget_gives_the_gradient_of_one_unsplit_batch(make_cfg):
    """Same rollout, same loss: one micro-batch of all rows vs a small token budget."""
    def grads_and_logps(**optim):
        cfg = make_cfg("mb", optim={"micro_batch_size": 64, **optim},
                       method={"name": "RPG-REINFORCE-URKL"})
        torch.manual_seed(0)
        trainer = Trainer(cfg)
        trainer.setup(track=False)
        rollout = trainer.collect()
        batch = rollout.batch
        old, _ = trainer.updater.logprobs_no_grad(trainer.policy, batch, with_entropy=False)
        # a perturbed policy, so that w != 1 and the clip and KL terms act
        with torch.no_grad():
            for p in trainer.model.parameters():
                p.add_(1e-2 * torch.randn_like(p))
        adv = torch.linspace(-1, 1, batch.input_ids.shape[0])
        trainer.model.zero_grad(set_to_none=True)
        rows = torch.arange(batch.input_ids.shape[0])
        loss, _ = trainer.updater.accumulate_gradients(batch, rows, old, None, adv)
        grads = [p.grad.clone() for p in trainer.model.parameters()]
        logp, _ = trainer.updater.logprobs_no_grad(trainer.policy, batch, with_entropy=False)
        return loss, grads, logp, batch

    loss_a, grads_a, logp_a, batch = grads_and_logps()
    budget = int(batch.input_ids.shape[1] * 3)  # about 3 rows of the longest length
    loss_b, grads_b, logp_b, _ = grads_and_logps(max_tokens_per_micro_batch=budget,
                                                 micro_batch_size=4)
    assert len(micro_batches(batch, torch.arange(16), 4, budget)) > 4  # really split
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(logp_b, logp_a, rtol=1e-5, atol=1e-6)
    for ga, gb in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(gb, ga, rtol=1e-4, atol=1e-6)
    # padding-free: the same rows as one concatenated sequence per micro-batch
    loss_c, grads_c, logp_c, _ = grads_and_logps(max_tokens_per_micro_batch=budget,
                                                 micro_batch_size=4, padding_free=True)
    torch.testing.assert_close(loss_c, loss_a, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(logp_c, logp_a, rtol=1e-5, atol=1e-6)
    for ga, gc in zip(grads_a, grads_c, strict=True):
        torch.testing.assert_close(gc, ga, rtol=1e-4, atol=1e-6)


def test_padding_free_budget_counts_real_tokens():
    lengths = [(4, 30), (6, 2), (5, 12), (4, 29), (3, 1), (6, 8), (5, 3)]
    batch = _batch(lengths)
    groups = micro_batches(batch, torch.arange(len(lengths)), max_rows=8, max_tokens=50,
                           padding_free=True)
    real = [sum(p + t for p, t in (lengths[i] for i in g.tolist())) for g in groups]
    assert sorted(torch.cat(groups).tolist()) == list(range(len(lengths)))
    assert all(n <= 50 for n, g in zip(real, groups) if len(g) > 1)
    # real tokens pack tighter than padded rows under the same budget
    assert len(groups) < len(micro_batches(batch, torch.arange(len(lengths)), 8, 50))


def _rank_tokens(batch, shares):
    lengths = batch.attention_mask.sum(-1)
    return [int(lengths[s].sum()) for s in shares]


def test_rows_are_dealt_to_ranks_by_token_count():
    """A skewed (log-normal) length mix over 4 ranks: every row on exactly one rank, and the
    ranks' token totals within one row's length of each other (a strided deal of the same
    rows is off by far more)."""
    gen = torch.Generator().manual_seed(3)
    resp = torch.exp(torch.randn(64, generator=gen) * 1.2 + 3).long().clamp(1, 2000)
    lengths = [(int(p), int(t)) for p, t in zip(torch.randint(3, 20, (64,), generator=gen), resp)]
    batch = _batch(lengths)
    rows = torch.randperm(64, generator=gen)
    shares = [balanced_share(batch, rows, r, 4) for r in range(4)]
    assert sorted(torch.cat(shares).tolist()) == list(range(64))
    tokens = _rank_tokens(batch, shares)
    longest = int(batch.attention_mask.sum(-1).max())
    assert max(tokens) - min(tokens) <= longest
    assert (max(tokens) - min(tokens)) / (sum(tokens) / 4) < 0.05
    strided = _rank_tokens(batch, [rows[r::4] for r in range(4)])
    assert max(strided) - min(strided) > 3 * (max(tokens) - min(tokens))
    # deterministic and order-preserving within a rank; world size 1 keeps `rows` as given
    assert all(torch.equal(s, balanced_share(batch, rows, r, 4)) for r, s in enumerate(shares))
    assert torch.equal(balanced_share(batch, rows, 0, 1), rows)
