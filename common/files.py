"""Reading and writing the harness's files, written once for every package.

    write_atomic(path, text)            # a crash never leaves a half-written file
    read_yaml(path)                     # a mapping; errors name the file
    read_jsonl(path, on_bad=warn)       # JSON objects, one a line; bad lines reported
    read_run_id(path)                   # an MLflow run id kept in a file, or None

Every result file (run config, metrics, evaluation summaries, run-id files) is written with
`write_atomic` or appended line by line, so readers only ever have to tolerate a torn *last*
line of a JSONL file (a crash mid-append); `read_jsonl` drops such a line and says so.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import yaml


def write_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` via a temp file in the same folder + rename (atomic on POSIX)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_yaml(path: str | Path) -> dict:
    """The mapping in a YAML file (an empty file is `{}`).

    Raises FileNotFoundError when it is missing and ValueError, naming the file, when it is
    not valid YAML or not a mapping."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of keys, got {type(data).__name__}")
    return data


def read_jsonl(path: str | Path, on_bad: Callable[[int, int, str], None] | None = None,
               *, require: str | None = None) -> list[dict]:
    """The JSON objects of a JSONL file, one a line (blank lines skipped).

    A line that is not a JSON object (or lacks the key `require`) is dropped and reported as
    `on_bad(lineno, n_lines, line)`; without `on_bad` it raises ValueError naming the file
    and the line. Read with `errors="replace"` so a torn multi-byte character is just a bad
    line. A missing file raises FileNotFoundError."""
    lines = Path(path).read_text(errors="replace").splitlines()
    rows = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict) or (require is not None and require not in row):
            if on_bad is None:
                what = "a JSON object" + (f" with {require!r}" if require else "")
                raise ValueError(f"{path}: line {lineno} is not {what}")
            on_bad(lineno, len(lines), line)
            continue
        rows.append(row)
    return rows


def read_run_id(path: str | Path | None) -> str | None:
    """An MLflow run id recorded in `path`; None when there is no path, file or id."""
    if not path:
        return None
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None
