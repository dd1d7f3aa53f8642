"""The metric registry: every key the trainer and the evaluation write has metadata, and the
metadata says how each one aggregates."""

from __future__ import annotations

import json

import pytest

from common.metrics import load_metric_meta, metric_meta


def test_every_key_the_trainer_logs_has_metadata(tmp_path):
    """A real one-step run of the tiny model: its metrics.jsonl keys are the names to cover
    (no copied list of names that could drift from what the trainer logs)."""
    from trainer.config import parse_run_config
    from trainer.loop import train
    from trainer.tiny import TinyConfig, build_tiny

    tiny = build_tiny(
        tmp_path / "tiny",
        TinyConfig(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                   sft_steps=2, sft_batch_size=4, sft_lr=5e-3),
        progress=False,
    )
    cfg = parse_run_config(
        {
            "run_id": "r", "out_dir": str(tmp_path / "run"), "seed": 0,
            "model": {"path": str(tiny), "device": "cpu"},
            "rollout": {"n": 2, "prompts_per_step": 2, "max_new_tokens": 8,
                        "overlong_buffer": 2, "dynamic_sampling": False},
            "optim": {"steps": 1, "lr": 1e-3},
            "tracking": {"mlflow_uri": None, "progress": False},
        },
        "test:r",
    )
    out = train(cfg)
    keys = json.loads((out / "metrics.jsonl").read_text().splitlines()[0]).keys()
    assert "reward_mean" in keys
    assert [k for k in keys if k not in load_metric_meta()] == []


def test_every_key_evaluation_writes_has_metadata():
    """error_rate is produced by evaluation; metric_meta("error_rate") used to raise."""
    from common.grading import GradeResult
    from eval.metrics import summarize_scorer

    grades = [[GradeResult(extracted="1", correct=True, status="ok"),
               GradeResult(extracted=None, correct=False, status="error")]]
    for key in summarize_scorer(grades, seed=0, ks=(1, 2)):
        assert metric_meta(key).name == key
    assert metric_meta("error_rate").higher_is_better is False


def test_metadata_directions_formats_and_families():
    meta = load_metric_meta()
    assert meta["mean"].higher_is_better is True
    assert meta["extract_fail_rate"].higher_is_better is False
    assert meta["entropy"].higher_is_better is None
    assert meta["time_step"].aggregation == "sum"
    assert meta["mean"].format(0.5938) == "59.38"
    assert meta["response_length_mean"].format(float("nan")) == "–"
    assert metric_meta("pass_at_16").display == "Pass@16"
    assert metric_meta("maj_at_32").fmt == "percent"
    with pytest.raises(KeyError, match="reward_mean"):
        metric_meta("rewrd_mean")


def test_running_totals_aggregate_as_last():
    """The trainer logs nonfinite_skips and ref_updates as running totals (0, 1, 1, 2 = two
    skips), so a run's summary is the last value, never the sum."""
    assert metric_meta("nonfinite_skips").aggregation == "last"
    assert metric_meta("ref_updates").aggregation == "last"


def test_the_trainer_reduces_loss_metrics_over_updates_as_declared():
    """A step's updates (here three, weights 0.5) reduce each loss metric by its declared
    aggregation: "max" takes the largest value, "mean" the weighted sum."""
    import torch

    from algorithms import LOSS_METRICS
    from trainer.update import add_metric

    sums: dict = {}
    for value in (1.0, 4.0, 2.0):
        for k in LOSS_METRICS:
            add_metric(sums, k, torch.tensor(value), 0.5)
    declared = {k: metric_meta(k).aggregation for k in LOSS_METRICS}
    assert set(declared.values()) == {"mean", "max"}
    assert {k: sums[k].item() for k in LOSS_METRICS} == {
        k: 4.0 if agg == "max" else 3.5 for k, agg in declared.items()}
