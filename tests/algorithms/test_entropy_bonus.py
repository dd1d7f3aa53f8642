"""`LossConfig.entropy_coef`: L -= coef * agg(H), verl's entropy bonus; 0 leaves the loss and
its graph exactly as they were."""

from __future__ import annotations

import pytest
import torch

from algorithms import LossConfig, compute_policy_loss


def _case():
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(3, 4, generator=g, dtype=torch.float64)).requires_grad_(True)
    old = logp.detach() + 0.05 * torch.randn(3, 4, generator=g, dtype=torch.float64)
    ent = torch.rand(3, 4, generator=g, dtype=torch.float64).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
    return logp, old, ent, mask, adv


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_bonus_is_minus_coef_times_the_aggregated_entropy(agg):
    logp, old, ent, mask, adv = _case()
    base = LossConfig(objective="reinforce", agg=agg)
    with_bonus = LossConfig(objective="reinforce", agg=agg, entropy_coef=0.25)
    plain, _ = compute_policy_loss(base, logp, old, None, adv, mask)
    loss, metrics = compute_policy_loss(with_bonus, logp, old, None, adv, mask, entropy=ent)
    # by hand: token-mean over the 7 tokens, or the mean of the rows' token means
    masked = (ent * mask).detach()
    h = (masked.sum() / 7 if agg == "token-mean"
         else (masked.sum(-1) / mask.sum(-1)).mean())
    torch.testing.assert_close(loss.detach(), plain.detach() - 0.25 * h, rtol=0, atol=1e-15)
    torch.testing.assert_close(metrics["loss"], loss.detach())
    loss.backward()
    torch.testing.assert_close(ent.grad, -0.25 * aggregate_weights(mask, agg), rtol=0,
                               atol=1e-15)


def aggregate_weights(mask: torch.Tensor, agg: str) -> torch.Tensor:
    """d agg(x) / dx by hand."""
    if agg == "token-mean":
        return mask / mask.sum()
    return mask / mask.sum(-1, keepdim=True) / mask.shape[0]


def test_coef_zero_is_bit_identical_and_leaves_the_entropy_out_of_the_graph():
    logp, old, ent, mask, adv = _case()
    cfg = LossConfig(objective="reinforce")
    plain, _ = compute_policy_loss(cfg, logp, old, None, adv, mask)
    given, _ = compute_policy_loss(cfg, logp, old, None, adv, mask, entropy=ent)
    assert torch.equal(plain, given)
    given.backward()
    assert ent.grad is None  # not even a zero gradient: no term was added


def test_bonus_without_entropy_is_a_clear_error():
    logp, old, _, mask, adv = _case()
    cfg = LossConfig(objective="reinforce", entropy_coef=0.1)
    with pytest.raises(ValueError, match=r"entropy_coef=0.1 needs the per-token entropy"):
        compute_policy_loss(cfg, logp, old, None, adv, mask)
    with pytest.raises(ValueError, match="entropy_coef"):
        LossConfig(objective="reinforce", entropy_coef=-1.0)


def test_bonus_uses_the_loss_aggregation_with_its_norm_len():
    """Dr. GRPO's constant divisor: the bonus is sum(H) / (B * norm_len), as the pg term."""
    logp, old, ent, mask, adv = _case()
    cfg = LossConfig(objective="reinforce", agg="seq-mean-token-sum-norm", entropy_coef=1.0)
    off = cfg.model_copy(update={"entropy_coef": 0.0})
    plain, _ = compute_policy_loss(off, logp, old, None, adv, mask, norm_len=6)
    loss, _ = compute_policy_loss(cfg, logp, old, None, adv, mask, entropy=ent, norm_len=6)
    by_hand = (ent * mask).sum().detach() / (3 * 6)
    torch.testing.assert_close(loss.detach(), plain.detach() - by_hand, rtol=0, atol=1e-15)
