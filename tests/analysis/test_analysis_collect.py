"""collect(): tidy frames from fixture run dirs, damaged inputs, metric metadata."""

from __future__ import annotations

import json

import pytest
from analysis_fixtures import RUNS, write_run

from analysis.collect import Collection, CollectionWarning, collect, collect_runs


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


def test_problem_scores_read_the_per_sample_records(tmp_path):
    """Per-problem Mean@n per scorer from eval/step_<N>/<bench>.jsonl (the records the
    evaluation writes): 0.45 of 20 samples = 9 correct, filled problem by problem."""
    from analysis_fixtures import per_problem

    from analysis.collect import problem_scores

    run = write_run(tmp_path / "runs", "a", "GRPO", 0, {}, evals={"toy": {5: 0.45}})
    scores = problem_scores(run, 5, "toy")
    assert scores["dapo"] == {"toy-0": 1.0, "toy-1": 1.0, "toy-2": 0.25, "toy-3": 0.0,
                              "toy-4": 0.0}
    assert list(scores["math_verify"].values()) == per_problem(0.40)
    assert problem_scores(run, 6, "toy") == {}  # not evaluated at that step
    path = run / "eval" / "step_5" / "toy.jsonl"
    path.write_text(path.read_text() + '{"problem_id": "toy-9", "scorers": {"dapo": {}}}\n')
    with pytest.raises(ValueError, match=r"toy.jsonl record 21: .*re-run its evaluation"):
        problem_scores(run, 5, "toy")
