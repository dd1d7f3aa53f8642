"""Reference schedules and the metrics/MLflow tracker."""

from __future__ import annotations

import json
import time
import warnings

import pytest
import torch

from trainer.reference import Reference
from trainer.tracking import MetricsFile, MLflowMirror


def _policy():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


def _nudge(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)


def test_rollout_holds_no_model_and_fixed_is_frozen():
    policy = _policy()
    assert not Reference("rollout", policy).held
    ref = Reference("fixed", policy)
    assert ref.held and not ref.model.training
    assert all(not p.requires_grad for p in ref.model.parameters())
    before = ref.model.weight.clone()
    _nudge(policy)
    for _ in range(50):
        ref.after_optimizer_step()
        ref.after_step(policy, 10.0)
    assert torch.equal(ref.model.weight, before) and ref.updates == 0


def test_every_k_refreshes_at_the_rollout_boundary_after_k_optimizer_steps():
    policy = _policy()
    ref = Reference("every_k", policy, k=3)
    _nudge(policy)
    for _ in range(2):
        ref.after_optimizer_step()
    ref.after_step(policy, None)
    assert ref.updates == 0 and not torch.equal(ref.model.weight, policy.weight)
    for _ in range(4):  # the k-th optimizer step falls inside this batch: no mid-batch refresh
        ref.after_optimizer_step()
        assert ref.updates == 0
    ref.after_step(policy, None)
    assert ref.updates == 1 and torch.equal(ref.model.weight, policy.weight)


def test_kl_target_refreshes_when_the_average_exceeds_kappa():
    policy = _policy()
    ref = Reference("kl_target", policy, kappa=0.1, kl_ema=0.5)
    ref.after_step(policy, 0.05)  # average 0.05
    ref.after_step(policy, 0.12)  # 0.5 * 0.05 + 0.5 * 0.12 = 0.085
    assert ref.updates == 0
    _nudge(policy)
    ref.after_step(policy, 0.2)  # 0.1425 > 0.1
    assert ref.updates == 1 and torch.equal(ref.model.weight, policy.weight)
    assert ref.schedule.kl_average is None


def test_reference_state_roundtrip():
    policy = _policy()
    ref = Reference("every_k", policy, k=1)
    _nudge(policy)
    ref.after_optimizer_step()
    ref.after_step(policy, None)
    state = ref.counters()
    assert not any(isinstance(v, (dict, torch.Tensor)) for v in state.values())  # no weights
    fresh = Reference("every_k", _policy(), k=1)
    fresh.load_state_dict(state)
    assert fresh.updates == 1 and fresh.counters() == state
    with pytest.raises(ValueError, match="kl_target"):
        Reference("sometimes", policy)


def test_metrics_file_drops_lines_after_the_resume_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    f = MetricsFile(path)
    for s in (1, 2, 3):
        f.write({"step": s})
    f.close()
    f = MetricsFile(path, resume_step=2)
    f.write({"step": 3, "x": 1})
    f.close()
    assert [json.loads(x) for x in path.read_text().splitlines()] == [
        {"step": 1}, {"step": 2}, {"step": 3, "x": 1}]


def test_unreachable_mlflow_never_stalls_the_loop(tmp_path):
    t0 = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mirror = MLflowMirror("http://127.0.0.1:9", "x", tmp_path, run_name="r", tags={},
                              params={"a": 1}, config_yaml="a: 1\n", close_timeout_s=1.0)
        for step in range(1, 200):
            mirror.log_metrics(step, {"loss": 0.1})
        enqueue = time.monotonic() - t0
        mirror.close()
    assert enqueue < 0.5
    assert time.monotonic() - t0 < 5.0


def test_mirror_batches_steps_and_close_flushes_them_at_once(tmp_path):
    # Steps wait on the thread for flush_every_s; close() must send them without waiting.
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mirror = MLflowMirror(uri, "x", tmp_path, run_name="r", tags={}, params={"a": 1},
                          config_yaml="a: 1\n", flush_every_s=600.0)
    for step in range(1, 31):
        mirror.log_metrics(step, {"loss": step / 10})
    t0 = time.monotonic()
    mirror.close()
    assert time.monotonic() - t0 < 60.0  # well under flush_every_s: close ended the wait
    history = MlflowClient(tracking_uri=uri).get_metric_history(mirror.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(s, s / 10) for s in range(1, 31)]
    run = MlflowClient(tracking_uri=uri).get_run(mirror.run_id)
    assert run.info.status == "FINISHED"
