"""Small file helpers: atomic writes (a crash never leaves a half-written file), the
run-id files the workflow passes between jobs, and where a sweep keeps the evaluation of
its initial model."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

INITIAL_DIR = "initial"  # results/<sweep>/initial/eval/step_0/<bench>.json: the initial model


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` via a temp file in the same folder + rename (atomic on POSIX)."""
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


def read_run_id(path: str | Path | None) -> str | None:
    """An MLflow run id recorded in `path`; None when there is no path, file or id."""
    if not path:
        return None
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None
