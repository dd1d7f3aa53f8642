"""Write constraints.txt: the exact versions of the environment the tests passed in.

    python tools/freeze_constraints.py            # from the active environment's pip freeze
    python tools/freeze_constraints.py --check    # exit 1 when constraints.txt differs

Why a constraints file and not pins in pyproject.toml: the project's own ranges stay what
the code needs, while the README's install commands (`pip install ... -c constraints.txt`)
reproduce the versions behind its numbers (a floating transformers 5.24 breaks vLLM 0.32).
Refresh it from the environment `.ci/run` passed in (docs/development.md, "Tested versions").
The project itself is left out (it is the editable install), and torch is pinned without its
local build tag (`2.13.0+cpu` -> `2.13.0`) so one file serves the CPU and CUDA wheels.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "constraints.txt"
PROJECT = "rpg-harness"
HEADER = ("# The versions the tests passed with (pip freeze, project excluded); refresh with\n"
          "# `python tools/freeze_constraints.py` (docs/development.md, \"Tested versions\").\n")


def constraint_lines(freeze: str) -> list[str]:
    """`name==version` lines of a pip freeze, without editable/URL installs or the project,
    local build tags dropped (`torch==2.13.0+cpu` -> `torch==2.13.0`), sorted by name."""
    out = []
    for line in freeze.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "-e", "--")) or "==" not in line or " @ " in line:
            continue
        name, version = line.split("==", 1)
        if name.lower().replace("_", "-") == PROJECT:
            continue
        out.append(f"{name}=={version.split('+', 1)[0]}")
    return sorted(out, key=str.lower)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    freeze = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
                            check=True, capture_output=True, text=True).stdout
    text = HEADER + "\n".join(constraint_lines(freeze)) + "\n"
    if args.check:
        same = CONSTRAINTS.is_file() and CONSTRAINTS.read_text() == text
        if not same:
            print(f"error: {CONSTRAINTS.name} differs from this environment's pip freeze; "
                  "run `python tools/freeze_constraints.py` to refresh it", file=sys.stderr)
        return 0 if same else 1
    CONSTRAINTS.write_text(text)
    print(f"wrote {CONSTRAINTS} ({text.count(chr(10)) - 2} packages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
