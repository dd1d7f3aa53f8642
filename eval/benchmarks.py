"""Benchmarks (AIME24, AIME25, AMC23, the generated toy and arithmetic tasks) from the HF hub,
a local file, or generated here (common.generated: every question of the held-out split).

Every benchmark loads into the same shape: a list of problems ``{"id", "problem",
"answer"}`` (all str), plus a ``source`` record ``{"kind", "path_or_id", "sha256"}`` where
sha256 hashes the loaded problems (canonical JSON), so two evaluations on the same
questions carry the same hash whatever the file format.

    from eval.benchmarks import load_benchmark
    bench = load_benchmark("aime24", path="data/benchmarks/aime24.jsonl", limit=5)

A local file is JSONL or parquet with ``problem`` and ``answer`` columns (``id`` optional:
"<name>-<index>" is generated). Without a path the hub source is used (``datasets``,
imported lazily; needs network or a warm HF cache).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from algorithms.registry import Registry
from common.files import read_jsonl
from common.generated import GENERATED


@dataclass(frozen=True)
class HubSource:
    """Where a benchmark lives on the HF hub and which columns hold what."""

    repo_id: str
    split: str
    problem_column: str = "problem"
    answer_column: str = "answer"
    id_column: str | None = "id"


# name -> its hub source; the one list of benchmark names (eval CLI, sweep eval.benchmarks)
BENCHMARKS: Registry[HubSource | None] = Registry("benchmark")
BENCHMARKS.register("aime24", HubSource("HuggingFaceH4/aime_2024", split="train"))
BENCHMARKS.register("aime25", HubSource("math-ai/aime25", split="test"))
BENCHMARKS.register("amc23", HubSource("math-ai/amc23", split="test", problem_column="question"))
VALIDATION_SUFFIX = "_val"  # `<task>_val`: a generated task's validation split, for tuning
for _name in GENERATED:  # generated (common.generated): the training task's held-out split
    BENCHMARKS.register(_name, None)
    if "validation" in GENERATED.get(_name).POOLS.splits:
        BENCHMARKS.register(_name + VALIDATION_SUFFIX, None)


def generated_split(name: str) -> tuple[str, str]:
    """(task, split) of a generated benchmark: `<task>` is its held-out split, `<task>_val`
    its validation split."""
    if name.endswith(VALIDATION_SUFFIX):
        return name.removesuffix(VALIDATION_SUFFIX), "validation"
    return name, "test"


@dataclass
class Benchmark:
    """Problems of one benchmark and where they came from."""

    name: str
    problems: list[dict]  # {"id": str, "problem": str, "answer": str}
    source: dict = field(default_factory=dict)  # {"kind", "path_or_id", "sha256"}


def _answer_str(value) -> str:
    # Hub answers are sometimes ints or floats (27.0); the scorers compare strings.
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def _content_sha256(problems: list[dict]) -> str:
    blob = json.dumps(problems, sort_keys=True, ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()


def _rows_to_problems(name: str, rows: list[dict], where: str, columns: HubSource) -> list[dict]:
    problems = []
    for i, row in enumerate(rows):
        missing = [c for c in (columns.problem_column, columns.answer_column) if c not in row]
        if missing:
            raise ValueError(
                f"{where}: record {i} lacks column(s) {missing}; it has {sorted(row)}. "
                f"Each record needs '{columns.problem_column}' and '{columns.answer_column}'."
            )
        problem, answer = row[columns.problem_column], row[columns.answer_column]
        if not isinstance(problem, str) or not problem.strip():
            raise ValueError(f"{where}: record {i} has an empty or non-text problem")
        if answer is None or _answer_str(answer) == "":
            raise ValueError(f"{where}: record {i} has an empty answer")
        raw_id = row.get(columns.id_column) if columns.id_column else None
        pid = str(raw_id) if raw_id is not None and str(raw_id) != "" else f"{name}-{i}"
        problems.append({"id": pid, "problem": problem, "answer": _answer_str(answer)})
    if not problems:
        raise ValueError(f"{where}: no problems found")
    ids = [p["id"] for p in problems]
    dupes = sorted({x for x in ids if ids.count(x) > 1})
    if dupes:
        raise ValueError(f"{where}: duplicate problem ids {dupes[:5]}")
    return problems


def _read_local(path: Path) -> list[dict]:
    if not path.is_file():
        raise FileNotFoundError(f"benchmark file {path} does not exist")
    if path.suffix == ".parquet":
        import pandas as pd

        try:
            return pd.read_parquet(path).to_dict(orient="records")
        except Exception as err:  # pyarrow raises several types for a bad file
            raise ValueError(f"{path}: not a readable parquet file ({err})") from err
    if path.suffix not in (".jsonl", ".json"):
        raise ValueError(f"{path}: unsupported benchmark file type; use .jsonl or .parquet")
    return read_jsonl(path)


def _read_hub(spec: HubSource) -> list[dict]:
    import datasets  # lazy: heavy import, and only real runs read the hub

    try:
        return [dict(r) for r in datasets.load_dataset(spec.repo_id, split=spec.split)]
    except Exception as err:  # network, auth, missing split: all end the same way
        raise RuntimeError(
            f"could not load {spec.repo_id} (split {spec.split}) from the HF hub: {err}. "
            "Offline? Pass a local file instead (--benchmark-file PATH)."
        ) from err


def load_benchmark(
    name: str, path: str | Path | None = None, limit: int | None = None
) -> Benchmark:
    """Load benchmark `name` from `path` (local file) or its default source.

    `limit` keeps the first `limit` problems (quick looks). Raises ValueError for an unknown
    name, a malformed file or a bad limit, FileNotFoundError for a missing file,
    RuntimeError when the hub cannot be reached.
    """
    spec = BENCHMARKS.get(name)
    if limit is not None and limit < 1:
        raise ValueError(f"limit={limit} must be >= 1")
    if path is not None:
        path = Path(path)
        problems = _rows_to_problems(name, _read_local(path), str(path), HubSource("", ""))
        kind, where = "local", str(path)
    elif spec is None:  # generated, deterministic: every problem of its split once
        task_name, split = generated_split(name)
        task = GENERATED.get(task_name)
        count = task.pool_size(split)
        problems = task.problems(split=split, n=count, seed=0)
        kind, where = "generated", f"{task.__name__}:{split}:n={count}:seed=0"
    else:
        problems = _rows_to_problems(name, _read_hub(spec), spec.repo_id, spec)
        kind, where = "hub", f"{spec.repo_id}:{spec.split}"
    if limit is not None:
        problems = problems[:limit]
    source = {"kind": kind, "path_or_id": where, "sha256": _content_sha256(problems)}
    return Benchmark(name=name, problems=problems, source=source)
