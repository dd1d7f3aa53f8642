"""`rollout.staleness` with a real in-process vLLM on CPU: the engine is pushed the lagged
weights (k pushes late), so it samples from the same weights that recompute the behaviour
log-probs. In float32 vLLM's log-prob of each sampled token equals the trainer's
recomputation (~1e-7, see test_vllm_rollout.py): a push of the current weights instead of
the lagged ones (or none) shows up as a gap of 1e-2 .. 1 nats once the weights move."""

from __future__ import annotations

import json

import pytest
import yaml
from _vllm_cli import run_cli

from trainer.config import parse_run_config

pytestmark = pytest.mark.slow

GAP_BOUND = {"rollout_logprob_gap_mean": 1e-5, "rollout_logprob_gap_max": 1e-4}


def test_vllm_samples_from_the_lagged_weights(vllm_tiny, tmp_path):
    cfg = parse_run_config({
        "run_id": "stale", "out_dir": str(tmp_path / "stale"), "seed": 0,
        "model": {"path": str(vllm_tiny), "device": "cpu"},
        "rollout": {"engine": "vllm", "n": 4, "prompts_per_step": 4, "max_new_tokens": 16,
                    "overlong_buffer": 4, "temperature": 0.8, "staleness": 1,
                    "dynamic_sampling": False},
        "optim": {"steps": 3, "lr": 1e-2},
        "tracking": {"mlflow_uri": None, "progress": False},
    }, "test:stale")
    path = tmp_path / "stale.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    run_cli("trainer", "--config", str(path))
    rows = [json.loads(line) for line in (tmp_path / "stale" / "metrics.jsonl").read_text()
            .splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    # The weights move at steps 1 and 2, so step 3 (sampled by theta_1 while the trainer
    # holds theta_2) would show a gap had vLLM been pushed the current weights.
    assert all((r["grad_norm"] or 0) > 1e-3 for r in rows[:2]), rows
    for row in rows:
        for key, bound in GAP_BOUND.items():
            assert row[key] is not None and 0 <= row[key] < bound, (row["step"], key, row[key])
