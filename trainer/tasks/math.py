"""DAPO-Math-17k-style training prompts: a local JSONL/parquet file or a hub dataset.

Accepted columns (auto-detected unless the config names them):
    problem: "problem", "question", or "prompt" (a string, or a chat list whose user turn
             holds the full DAPO instruction, as in BytedTsinghua-SIA/DAPO-Math-17k; the
             instruction wrapper is stripped so the trainer's template is applied once)
    answer:  "answer", "solution", or "reward_model.ground_truth" (DAPO-Math-17k)

    problems = load_math_problems("data/dapo_math.jsonl", limit=1000)
"""

from __future__ import annotations

from pathlib import Path

from common.files import read_jsonl
from common.prompts import TEMPLATES

_DAPO_HEAD, _DAPO_TAIL = TEMPLATES["dapo"].text.split("{problem}")
PROBLEM_KEYS = ("problem", "question", "prompt")
ANSWER_KEYS = ("answer", "solution", "reward_model.ground_truth")


def _get(row: dict, dotted: str):
    value = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _problem_text(value) -> str | None:
    if isinstance(value, list):  # chat messages: take the (last) user turn
        users = [m.get("content") for m in value if isinstance(m, dict) and m.get("role") == "user"]
        value = users[-1] if users else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    head, tail = _DAPO_HEAD.strip(), _DAPO_TAIL.strip()
    if text.startswith(head) and text.endswith(tail):  # already wrapped in the DAPO template
        text = text[len(head) : len(text) - len(tail)].strip()
    return text


def _read_rows(source: str, split: str) -> list[dict]:
    path = Path(source)
    if path.suffix == ".jsonl":
        if not path.is_file():
            raise FileNotFoundError(f"task.path={source} does not exist")
        return read_jsonl(path)
    if path.suffix == ".parquet":
        if not path.is_file():
            raise FileNotFoundError(f"task.path={source} does not exist")
        import pandas as pd

        return pd.read_parquet(path).to_dict("records")
    if path.exists():
        raise ValueError(f"task.path={source}: use a .jsonl or .parquet file, or a hub id")
    from datasets import load_dataset  # lazy: hub access only when asked for

    return list(load_dataset(source, split=split))


def load_math_problems(source: str, *, split: str = "train", problem_key: str | None = None,
                       answer_key: str | None = None, limit: int | None = None) -> list[dict]:
    """Problems as dicts {id, problem, answer} (str), in file order, at most `limit`."""
    rows = _read_rows(source, split)
    if not rows:
        raise ValueError(f"task.path={source} holds no rows")
    first = rows[0]
    pk = problem_key or next((k for k in PROBLEM_KEYS if _get(first, k) is not None), None)
    ak = answer_key or next((k for k in ANSWER_KEYS if _get(first, k) is not None), None)
    if pk is None or ak is None:
        raise ValueError(f"{source}: cannot find problem/answer columns in {sorted(first)}; "
                         f"set task.problem_key / task.answer_key")
    out = []
    for i, row in enumerate(rows[: limit or len(rows)]):
        problem, answer = _problem_text(_get(row, pk)), _get(row, ak)
        if not problem or answer is None or str(answer).strip() == "":
            raise ValueError(f"{source}: row {i} has no usable {pk!r} / {ak!r}")
        out.append({"id": str(row.get("id", f"math-{i:06d}")), "problem": problem,
                    "answer": str(answer).strip()})
    return out
