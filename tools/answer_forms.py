"""What a model's held-out answers look like, beyond the grader's verdict: the shares of
`analysis.answers` (strict and lenient credit, a \\boxed{} at all, the right last number, an
expression credited for restating the question, cut off, mean tokens) for every arithmetic
evaluation file under a folder.

    python tools/answer_forms.py docs/runs/real-cpu/samples      # a snapshot's samples
    python tools/answer_forms.py results/real-cpu                 # a sweep's evaluations

A report states the same for each run's last step ("Answer forms"); this reads any folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analysis.answers import FORMS, forms, read  # noqa: E402

STRICT, LENIENT = "math_verify_boxed", "math_verify"  # config/real-cpu.yaml's two scorers


def files(root: Path) -> list[Path]:
    """A snapshot's samples/*.jsonl.gz, or a sweep's initial and per-run arithmetic.jsonl."""
    found = sorted(root.glob("*arithmetic.jsonl.gz"))
    return found or sorted(root.glob("**/eval/step_*/arithmetic.jsonl"))


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    root = Path(argv[0])
    paths = files(root)
    if not paths:
        print(f"error: no arithmetic evaluations under {root}", file=sys.stderr)
        return 2
    print(f"strict = {STRICT}, lenient = {LENIENT}")
    print("file".ljust(48) + "".join(FORMS[k].rjust(20) for k in FORMS))
    for path in paths:
        shares = forms(read(path), STRICT, LENIENT)
        cells = [f"{shares[k]:.1f}" if k == "tokens" else f"{100 * shares[k]:.1f}%" for k in FORMS]
        print(str(path.relative_to(root)).ljust(48) + "".join(c.rjust(20) for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
