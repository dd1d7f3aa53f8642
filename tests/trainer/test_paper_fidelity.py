"""What the trainer does around the loss, pinned to the paper and the released recipe:
dynamic sampling on accuracy, warm-up in RL steps, every_k refreshes at rollout
boundaries, the true maximum importance weight."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import trainer.update as update
from trainer.collection import has_signal
from trainer.loop import Trainer, train


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


LOSSES = ("loss", "pg_loss", "kl_loss", "is_weight_mean", "is_weight_max", "clip_frac_upper",
          "clip_frac_lower", "clip_frac_dual", "reward_mean", "acc_mean", "grad_norm")


def test_filter_on_accuracy_drops_an_all_wrong_group_that_length_shaping_made_unequal():
    """The review's case: 16 wrong answers, one of them long enough to be penalised."""
    rewards = [-1.0] * 15 + [-1.9]
    correct = [False] * 16
    assert not has_signal(rewards, correct, "acc")
    assert has_signal(rewards, correct, "score")
    assert has_signal([1.0, -1.0], [True, False], "acc")
    assert not has_signal([1.0, 0.5], [True, True], "acc")  # all right: no signal either


@pytest.mark.parametrize("metric", ["acc", "score"])
def test_dynamic_sampling_keeps_only_groups_the_metric_accepts(make_cfg, metric):
    """Overlong shaping on every response (buffer ~ whole budget): rewards of an all-wrong
    group differ, so only the acc filter drops it. Correct = reward > -0.5 (rewards are
    +-1 plus a penalty in [-1, 0])."""
    cfg = make_cfg(f"ds-{metric}", method={"name": "DAPO"},
                   rollout={"dynamic_sampling": True, "filter_metric": metric,
                            "max_new_tokens": 24, "overlong_buffer": 23, "max_gen_batches": 4,
                            "gen_prompts_per_round": 8})
    trainer = Trainer(cfg)
    trainer.setup(track=False)
    rollout = trainer.collect()
    assert rollout.stats["gen_batches"] >= 1
    groups = rollout.rewards.reshape(-1, cfg.rollout.n)
    mixed = [bool((g > -0.5).any() and (g <= -0.5).any()) for g in groups]
    unequal = [bool(g.max() != g.min()) for g in groups]
    assert all(unequal)
    if metric == "acc":
        assert all(mixed)
    else:
        assert not all(mixed)  # the weak test model: some kept groups are all wrong
    assert rollout.stats["groups_kept"] + rollout.stats["groups_dropped"] == (
        8 * rollout.stats["gen_batches"])


def test_warmup_counts_rl_steps_not_optimizer_updates(make_cfg):
    """4 optimizer updates per RL step; warm-up of 2 RL steps: lr/2, then lr."""
    out = train(make_cfg("warm", optim={"steps": 3, "lr": 1e-3, "warmup_rl_steps": 2,
                                        "mini_batch_size": 4}))
    assert [r["lr"] for r in metrics(out)] == pytest.approx([5e-4, 1e-3, 1e-3], rel=1e-12)


@pytest.mark.parametrize("k", [1, 3])
def test_every_k_within_one_batch_equals_the_rollout_reference(make_cfg, k):
    """With k <= the 4 updates of each RL step, every rollout boundary refreshes the
    reference to the policy that generates the next batch: the run must equal the rollout
    schedule exactly. A mid-batch refresh (k = 3) would make the next reference a policy
    that generated nothing."""
    optim = {"steps": 3, "mini_batch_size": 4, "lr": 1e-2}
    ref = train(make_cfg("rollout", optim=optim,
                         method={"reference": {"schedule": "rollout"}}))
    every = train(make_cfg(f"every{k}", optim=optim,
                           method={"reference": {"schedule": "every_k", "k": k}}))
    for a, b in zip(metrics(ref), metrics(every), strict=True):
        assert {m: a[m] for m in LOSSES} == {m: b[m] for m in LOSSES}
        assert b["ref_updates"] == a["step"]


def test_is_weight_max_is_the_maximum_over_every_update(make_cfg, monkeypatch):
    seen: list[float] = []
    real = update.compute_policy_loss

    def recording(*args, **kwargs):
        loss, m = real(*args, **kwargs)
        seen.append(float(m["is_weight_max"]))
        return loss, m

    monkeypatch.setattr(update, "compute_policy_loss", recording)
    out = train(make_cfg("wmax", optim={"steps": 1, "epochs": 2, "mini_batch_size": 4,
                                        "micro_batch_size": 2, "lr": 1e-2}))
    assert len(seen) == 16 and max(seen) > 1.0
    assert metrics(out)[0]["is_weight_max"] == max(seen)
