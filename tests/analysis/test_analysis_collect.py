"""collect(): tidy frames from fixture run dirs, damaged inputs, metric metadata."""

from __future__ import annotations

import json

import pytest
from analysis_fixtures import RUNS, write_run

from analysis.collect import (
    Collection,
    CollectionWarning,
    collect,
    collect_runs,
    load_metric_meta,
    metric_meta,
)

CANONICAL = (
    "step reward_mean reward_std acc_mean response_length_mean response_length_max "
    "truncated_frac entropy kl_ref_k1 kl_ref_k3 kl_behav_k1 kl_behav_k3 is_weight_mean "
    "is_weight_max clip_frac_upper clip_frac_lower clip_frac_dual pg_loss kl_loss loss "
    "groups_kept groups_dropped gen_batches grad_norm lr time_rollout time_logprob time_update "
    "time_step tokens_per_sec rollout_logprob_gap_mean rollout_logprob_gap_max nonfinite_skips "
    "ref_updates"
).split()


def _collect(path) -> Collection:
    with pytest.warns(CollectionWarning):
        return collect(path)


def test_train_frame_is_tidy(sweep):
    col = _collect(sweep)
    train = col.train
    # 5 readable runs x 3 steps, minus the truncated last line of urkl_s1
    assert len(train) == 14
    assert not train.duplicated(["run_id", "step"]).any()
    assert list(train.columns[:5]) == ["run_id", "label", "seed", "tag_beta", "tag_method"]
    assert sorted(train[train.run_id == "urkl_s1"]["step"]) == [1, 2]
    row = train[(train.run_id == "grpo_s0") & (train.step == 2)].iloc[0]
    assert row.label == "GRPO" and row.tag_method == "GRPO" and row.tag_beta == ""
    assert row.reward_mean == pytest.approx(0.2) and row.entropy == pytest.approx(0.8)


def test_eval_frame_is_tidy(sweep):
    train, ev = _collect_pair(sweep)
    # 4 evaluated runs x 2 steps x 2 benchmarks x 2 scorers
    assert len(ev) == 32
    assert not ev.duplicated(["run_id", "step", "benchmark", "scorer"]).any()
    assert set(ev.run_id) == {"urkl_s0", "urkl_s1", "grpo_s0", "dapo_s0"}
    for col in (
        "mean",
        "mean_stderr",
        "pass_at_1",
        "pass_at_4",
        "maj_at_4",
        "extract_fail_rate",
        "timeout_rate",
        "truncation_rate",
        "n",
        "tag_method",
    ):
        assert col in ev.columns, col
    r = ev[(ev.run_id == "urkl_s1") & (ev.step == 20) & (ev.benchmark == "amc23")]
    assert r.set_index("scorer")["mean"].to_dict() == pytest.approx(
        {"dapo": 0.90, "math_verify": 0.85}
    )
    assert set(r["n"]) == {4}


def _collect_pair(path):
    with pytest.warns(CollectionWarning):
        return collect_runs(path)


def test_damage_is_reported_by_file(sweep):
    with pytest.warns(CollectionWarning) as rec:
        col = collect(sweep)
    messages = [str(w.message) for w in rec]
    assert messages == col.warnings
    assert any("urkl_s1" in m and "metrics.jsonl" in m and "last line" in m for m in messages)
    assert any(str(sweep / "runs" / "broken" / "config.yaml") in m for m in messages)
    assert "broken" not in set(col.runs.run_id)


def test_run_without_evals_is_kept_and_flagged(sweep):
    col = _collect(sweep)
    runs = col.runs.set_index("run_id")
    assert set(runs.index) == set(RUNS)
    assert not runs.loc["rpp_s0", "has_eval"] and runs.loc["rpp_s0", "eval_steps"] == []
    assert runs.loc["urkl_s0", "eval_steps"] == [10, 20]
    assert "rpp_s0" in set(col.train.run_id) and "rpp_s0" not in set(col.eval.run_id)
    assert runs.loc["urkl_s0", "done"]


def test_bad_summary_and_duplicate_steps(tmp_path):
    runs = tmp_path / "runs"
    run = write_run(runs, "a", "A", 0, {"method": "GRPO"}, evals={"aime24": {5: 0.5}})
    (run / "eval" / "step_5" / "aime25.json").write_text('{"benchmark": "aime25", "sco')
    # a resumed run re-logged step 3 with new values: the later line wins
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 3, "reward_mean": 9.0}) + "\n")
    with pytest.warns(CollectionWarning) as rec:
        col = collect(tmp_path)
    msgs = " ".join(str(w.message) for w in rec)
    assert "aime25.json" in msgs and "step 3 logged twice" in msgs
    assert set(col.eval.benchmark) == {"aime24"}
    assert col.train.set_index("step").loc[3, "reward_mean"] == 9.0
    assert list(col.train.step) == [1, 2, 3]


def test_missing_sweep_layout_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="runs"):
        collect(tmp_path)


def test_empty_sweep_gives_empty_frames(tmp_path):
    (tmp_path / "runs").mkdir()
    train, ev = collect_runs(tmp_path)
    assert train.empty and ev.empty
    assert {"run_id", "label", "seed", "step"} <= set(train.columns)
    assert {"benchmark", "scorer"} <= set(ev.columns)


def test_metric_registry_covers_canonical_names():
    meta = load_metric_meta()
    missing = [name for name in CANONICAL if name not in meta]
    assert missing == []
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


def test_every_key_evaluation_writes_has_metadata():
    """error_rate is produced by evaluation; metric_meta("error_rate") used to raise."""
    from common.grading import GradeResult
    from eval.metrics import summarize_scorer

    grades = [[GradeResult(extracted="1", correct=True, status="ok"),
               GradeResult(extracted=None, correct=False, status="error")]]
    for key in summarize_scorer(grades, seed=0):
        assert metric_meta(key).name == key
    assert metric_meta("error_rate").higher_is_better is False


def test_running_totals_aggregate_as_last():
    """The trainer logs nonfinite_skips as a running total (0, 1, 1, 2 = two skips)."""
    assert metric_meta("nonfinite_skips").aggregation == "last"
    assert metric_meta("ref_updates").aggregation == "last"
