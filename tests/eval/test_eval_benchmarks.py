"""Benchmark loading: shared JSONL files, parquet, toy, and clear errors for bad files."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from eval.benchmarks import BENCHMARKS, load_benchmark


@pytest.mark.parametrize(("name", "count"), [("aime24", 30), ("aime25", 30), ("amc23", 40)])
def test_shared_files_load(benchmark_dir, name, count):
    bench = load_benchmark(name, path=benchmark_dir / f"{name}.jsonl")
    assert bench.name == name and len(bench.problems) == count
    first = bench.problems[0]
    assert set(first) == {"id", "problem", "answer"}
    assert all(isinstance(v, str) and v for p in bench.problems for v in p.values())
    assert first["id"] == f"{name}-00"
    assert bench.source["kind"] == "local" and len(bench.source["sha256"]) == 64


def test_aime24_first_answer_and_limit(benchmark_dir):
    bench = load_benchmark("aime24", path=benchmark_dir / "aime24.jsonl", limit=3)
    assert [p["id"] for p in bench.problems] == ["aime24-00", "aime24-01", "aime24-02"]
    assert bench.problems[0]["answer"] == "540"
    full = load_benchmark("aime24", path=benchmark_dir / "aime24.jsonl")
    assert bench.source["sha256"] != full.source["sha256"]  # the hash covers what is evaluated


def test_parquet_and_generated_ids_and_numeric_answers(tmp_path, benchmark_dir):
    rows = [json.loads(x) for x in (benchmark_dir / "amc23.jsonl").read_text().splitlines()]
    jsonl = load_benchmark("amc23", path=benchmark_dir / "amc23.jsonl")
    path = tmp_path / "amc.parquet"
    pd.DataFrame(rows).to_parquet(path)
    assert load_benchmark("amc23", path=path).problems == jsonl.problems
    assert load_benchmark("amc23", path=path).source["sha256"] == jsonl.source["sha256"]
    # no id column, numeric answers (27.0 is how some hub sets store integers)
    no_id = tmp_path / "noid.parquet"
    pd.DataFrame({"problem": ["a?", "b?"], "answer": [27.0, 0.5]}).to_parquet(no_id)
    probs = load_benchmark("amc23", path=no_id).problems
    assert [(p["id"], p["answer"]) for p in probs] == [("amc23-0", "27"), ("amc23-1", "0.5")]


def test_toy_benchmark():
    bench = load_benchmark("toy", limit=5)
    assert len(bench.problems) == 5 and bench.source["kind"] == "generated"
    p = bench.problems[0]
    assert p["id"].startswith("toy-test-") and p["answer"].lstrip("-").isdigit()
    assert load_benchmark("toy").problems[:5] == bench.problems
    full = load_benchmark("toy").problems
    assert len(full) == len({p["problem"] for p in full}) == 121  # the whole held-out pool, once


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match=r"'aime26' is not registered.*aime24"):
        load_benchmark("aime26")
    assert set(BENCHMARKS) == {"aime24", "aime25", "amc23", "toy", "arithmetic",
                               "arithmetic_val"}
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_benchmark("aime24", path=tmp_path / "missing.jsonl")
    bad = _write(tmp_path / "bad.jsonl", '{"problem": "x", "answer": "1"}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad.jsonl: line 2 is not a JSON object"):
        load_benchmark("aime24", path=bad)
    cols = _write(tmp_path / "cols.jsonl", '{"question": "x", "answer": "1"}\n')
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['problem'\]"):
        load_benchmark("aime24", path=cols)
    empty = _write(tmp_path / "empty.jsonl", "\n")
    with pytest.raises(ValueError, match="no problems"):
        load_benchmark("aime24", path=empty)
    dup = _write(tmp_path / "dup.jsonl", '{"id": "a", "problem": "x", "answer": "1"}\n' * 2)
    with pytest.raises(ValueError, match="duplicate problem ids"):
        load_benchmark("aime24", path=dup)
    blank = _write(tmp_path / "blank.jsonl", '{"problem": "x", "answer": ""}\n')
    with pytest.raises(ValueError, match="empty answer"):
        load_benchmark("aime24", path=blank)
    with pytest.raises(ValueError, match="unsupported benchmark file type"):
        load_benchmark("aime24", path=_write(tmp_path / "x.csv", "problem,answer\n"))
    with pytest.raises(ValueError, match="not a readable parquet"):
        load_benchmark("aime24", path=_write(tmp_path / "x.parquet", "not parquet"))
    with pytest.raises(ValueError, match="limit=0"):
        load_benchmark("toy", limit=0)


def test_generated_arithmetic_is_its_held_out_split_and_never_a_training_question():
    from common import arithmetic

    bench = load_benchmark("arithmetic")
    assert len(bench.problems) == arithmetic.pool_size("test") == 579
    assert bench.source["path_or_id"] == "common.arithmetic:test:n=579:seed=0"
    train = {p["problem"] for p in arithmetic.problems("train", arithmetic.pool_size("train"))}
    assert not train & {p["problem"] for p in bench.problems}
    assert len(train) == 2029  # 2,318 before the validation pool was cut from it
    for p in bench.problems[:50]:  # the gold is the question's value
        a, op, b = p["problem"].removeprefix("What is ").removesuffix("?").split()
        assert str({"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]) == \
            p["answer"]


def test_arithmetic_val_is_a_validation_split_disjoint_from_train_and_test():
    """Three pools, pairwise disjoint, covering every question once; the held-out pool is
    the one cut before the validation pool existed (the same 579 questions, in order), and
    the toy task, which has no validation pool, says which splits it has."""
    import random

    from common import arithmetic, toy

    pools = {s: [p["problem"] for p in arithmetic.problems(s, arithmetic.pool_size(s))]
             for s in ("train", "validation", "test")}
    sets = {s: set(v) for s, v in pools.items()}
    assert [len(sets[s]) for s in ("train", "validation", "test")] == [2029, 289, 579]
    assert not (sets["train"] & sets["validation"] or sets["train"] & sets["test"]
                or sets["validation"] & sets["test"])
    assert len(sets["train"] | sets["validation"] | sets["test"]) == 2897
    before = [q for q, _ in arithmetic._questions()]
    random.Random("arithmetic-split-v1").shuffle(before)  # the two-pool cut, as it was
    assert sets["test"] == set(before[:579])
    bench = load_benchmark("arithmetic_val")
    assert [p["problem"] for p in bench.problems] == pools["validation"]
    assert bench.source["path_or_id"] == "common.arithmetic:validation:n=289:seed=0"
    assert bench.problems[0]["id"].startswith("arithmetic-validation-")
    with pytest.raises(ValueError, match=r"not a toy split; choose one of \('train', 'test'\)"):
        toy.problems("validation", 3)
