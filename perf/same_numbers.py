"""Check that a speed change kept the numbers: two sweep (or run) folders, same results.

    python perf/same_numbers.py OLD_DIR NEW_DIR      # e.g. results/speed of two checkouts

Every `metrics.jsonl` under OLD_DIR is compared line by line with the file at the same
relative path under NEW_DIR, without the keys that measure time (`time_*`,
`tokens_per_sec`); every evaluation file (`eval/step_N/<bench>.json` and `.jsonl`) is compared
whole, without its timing keys. Prints one line per file and exits 1 if any differs or is
missing: a pure-speed change run on the same machine and config must print ALL IDENTICAL.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TIMING_PREFIXES = ("time_", "tokens_per_sec", "wall_s", "seconds")


def is_timing(key) -> bool:
    """A key (or a table's column) that measures time, not a result."""
    return str(key).startswith(TIMING_PREFIXES)


def _without_timing(record: dict) -> dict:
    return {k: v for k, v in record.items() if not is_timing(k)}


def records(path: Path) -> list[dict]:
    """A .jsonl file's lines or a .json file's object, timing keys dropped."""
    text = path.read_text()
    rows = ([json.loads(line) for line in text.splitlines() if line.strip()]
            if path.suffix == ".jsonl" else [json.loads(text)])
    return [_without_timing(r) if isinstance(r, dict) else r for r in rows]


def compared_files(old: Path) -> list[Path]:
    """The files compared, relative to `old`: metrics and evaluation outputs."""
    found = [*old.rglob("metrics.jsonl"), *old.rglob("eval/step_*/*.json"),
             *old.rglob("eval/step_*/*.jsonl")]
    return sorted(p.relative_to(old) for p in found)


def differing(old: Path, new: Path) -> tuple[list[Path], list[str]]:
    """(the files compared, those missing or different under `new`)."""
    files = compared_files(old)
    return files, [str(f) for f in files
                   if not (new / f).is_file() or records(old / f) != records(new / f)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    args = parser.parse_args(argv)
    files = compared_files(args.old)
    if not files:
        print(f"{args.old}: no metrics.jsonl or eval files to compare", file=sys.stderr)
        return 2
    differ = 0
    for rel in files:
        new = args.new / rel
        if not new.is_file():
            verdict = "MISSING in new"
        else:
            verdict = "identical" if records(args.old / rel) == records(new) else "DIFFERS"
        differ += verdict != "identical"
        print(f"{rel}: {verdict}")
    print("ALL IDENTICAL" if not differ else f"{differ} of {len(files)} files differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
