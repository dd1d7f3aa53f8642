"""`rollout.staleness` with a real in-process vLLM on CPU: the engine is pushed the lagged
weights (k pushes late), so it samples from the same weights that recompute the behaviour
log-probs. In float32 vLLM's log-prob of each sampled token equals the trainer's
recomputation (~1e-7, see test_vllm_rollout.py): a push of the current weights instead of
the lagged ones (or none) shows up as a gap of 1e-2 .. 1 nats once the weights move.
`rollout.mode: async` (vLLM in a worker process, one step ahead) writes the same metrics as
the simulated run, the engine's log-probs included, at k = 1 and 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _vllm_cli import run_cli

from trainer.config import parse_run_config

pytestmark = pytest.mark.slow

GAP_BOUND = {"rollout_logprob_gap_mean": 1e-5, "rollout_logprob_gap_max": 1e-4}


def run_config(model, out, *, staleness: int = 1, mode: str = "sync", steps: int = 3,
               debug: dict | None = None) -> Path:
    """The run config of `train_cli`, written beside `out`."""
    cfg = parse_run_config({
        "run_id": out.name, "out_dir": str(out), "seed": 0,
        "model": {"path": str(model), "device": "cpu"},
        "rollout": {"engine": "vllm", "n": 4, "prompts_per_step": 4, "max_new_tokens": 16,
                    "overlong_buffer": 4, "temperature": 0.8, "staleness": staleness,
                    "dynamic_sampling": False, "mode": mode},
        "optim": {"steps": steps, "lr": 1e-2},
        "tracking": {"mlflow_uri": None, "progress": False},
        "debug": debug or {},
    }, f"test:{out.name}")
    path = out.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    return path


def train_cli(model, out, *, staleness: int = 1, mode: str = "sync", steps: int = 3,
              threads: bool = False) -> list[dict]:
    """`python -m trainer` on the tiny model with vLLM; the metrics rows, timings dropped.
    `threads`: OMP_NUM_THREADS=1 for the trainer (and the worker's one thread), so both
    runs compute with the same thread counts."""
    path = run_config(model, out, staleness=staleness, mode=mode, steps=steps)
    run_cli("trainer", "--config", str(path), env={"OMP_NUM_THREADS": "1"} if threads else None)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time_") and k != "tokens_per_sec"}
            for r in rows]


def test_vllm_samples_from_the_lagged_weights(vllm_tiny, tmp_path):
    rows = train_cli(vllm_tiny, tmp_path / "stale")
    assert [r["step"] for r in rows] == [1, 2, 3]
    # The weights move at steps 1 and 2, so step 3 (sampled by theta_1 while the trainer
    # holds theta_2) would show a gap had vLLM been pushed the current weights.
    assert all((r["grad_norm"] or 0) > 1e-3 for r in rows[:2]), rows
    for row in rows:
        for key, bound in GAP_BOUND.items():
            assert row[key] is not None and 0 <= row[key] < bound, (row["step"], key, row[key])


@pytest.mark.parametrize("k", [1, 2])
def test_async_vllm_equals_the_simulated_staleness(vllm_tiny, tmp_path, k):
    """vLLM sampling in the worker process, one step ahead: the same metrics.jsonl as the
    in-process simulated run, the engine's log-probs (gap, correction) included."""
    steps = k + 2
    simulated = train_cli(vllm_tiny, tmp_path / f"sim{k}", staleness=k, steps=steps,
                          threads=True)
    overlapped = train_cli(vllm_tiny, tmp_path / f"async{k}", staleness=k, mode="async",
                           steps=steps, threads=True)
    assert overlapped == simulated
    assert [r["rollout_weights_step"] for r in overlapped] == [max(t - 1 - k, 0)
                                                               for t in range(1, steps + 1)]
    assert all(r["rollout_logprob_gap_max"] < GAP_BOUND["rollout_logprob_gap_max"]
               for r in overlapped)


def test_async_vllm_with_wrong_weights_under_the_right_label_stops(vllm_tiny, tmp_path):
    """The worker skips loading step 1's weights into vLLM and samples with step 0's under
    step 1's label: the fingerprint it returns stops the run before step 3 trains on it."""
    out = tmp_path / "wrong"
    path = run_config(vllm_tiny, out, mode="async", debug={"rollout_wrong_weights": 1})
    proc = subprocess.run([sys.executable, "-m", "trainer", "--config", str(path)],
                          env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert re.search(r"error: WrongWeights: .* under the label of step 1, but the weights it "
                     r"holds have fingerprint", proc.stderr), proc.stderr[-3000:]
    rows = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [1, 2]
