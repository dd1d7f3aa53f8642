"""Checks of a sweep's inputs that need more than its own schema: the files it names, the
model path and every cell's trainer config. All run at parse time (`snakemake -n` included),
so a bad input stops the sweep before its first job, with the file, the key and the fix.
"""

from __future__ import annotations

from pathlib import Path

from trainer.config import check_model_path
from trainer.pretrained import MANIFEST, gguf_path, is_prepared

from .expand import Cell
from .runconfig import TINY, model_dir, run_config
from .spec import SweepConfig, SweepError


def check_inputs(sweep: SweepConfig, cells: list[Cell], source: str) -> None:
    """Raise SweepError on the first input that cannot work (paths are relative to the
    directory the workflow runs in)."""
    for bench, path in sweep.eval.files.items():
        if not Path(path).is_file():
            raise SweepError(f"{source}: eval.files.{bench}: {path} does not exist; give an "
                             "existing JSONL/parquet file, or drop the key to load the hub copy")
    model_path = sweep.base.get("model", {}).get("path", TINY)
    made = model_dir(sweep)
    if made is None:  # the user's folder or hub id (the workflow makes the others)
        try:
            check_model_path(str(model_path), probe_hub=False)  # no network at parse time
        except ValueError as exc:
            raise SweepError(f"{source}: base.{exc}") from None
    elif is_prepared(str(model_path)) and not (made / MANIFEST).is_file():
        try:  # the rule prepare_model will need the wheel: say so before any job
            gguf_path(str(model_path))
        except FileNotFoundError as exc:
            raise SweepError(f"{source}: base.{exc}") from None
    for cell in cells:
        run_config(sweep, cell, source)
