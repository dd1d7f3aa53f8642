"""With the hf engine the sampler is the training model (mu = pi_old exactly): a real 2-step
run under every `rollout.correction.mode` gives mode none's metrics and weights."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from algorithms import CORRECTION_METRICS, CORRECTIONS
from trainer.loop import train

TIMING = {"time_rollout", "time_logprob", "time_update", "time_step", "tokens_per_sec"}


def run(make_cfg, mode: str):
    out = train(make_cfg(mode, optim={"steps": 2, "epochs": 2, "mini_batch_size": 8},
                         rollout={"correction": {"mode": mode, "cap": 1.5}},
                         checkpoint={"eval_steps": [2]}))
    rows = [{k: v for k, v in json.loads(line).items() if k not in TIMING}
            for line in (out / "metrics.jsonl").read_text().splitlines()]
    return rows, load_file(out / "checkpoints" / "step_2" / "model.safetensors")


def test_every_mode_is_the_identity_with_the_hf_engine(make_cfg):
    rows, weights = run(make_cfg, "none")
    assert len(rows) == 2
    for row in rows:  # mu = pi_old: ratios exactly 1, nothing cut, full sample size
        assert row["correction_ratio_mean"] == row["correction_ratio_max"] == 1.0
        assert row["correction_frac_truncated"] == row["correction_frac_masked"] == 0.0
        assert row["correction_ess"] == 1.0 and row["correction_kl_mu_old"] == 0.0
    for mode in CORRECTIONS:
        if mode == "none":
            continue
        other_rows, other_weights = run(make_cfg, mode)
        assert other_rows == rows, mode
        assert all(torch.equal(other_weights[k], weights[k]) for k in weights), mode
    assert set(CORRECTION_METRICS) <= set(rows[0])
