"""What a model's held-out answers look like, beyond the grader's verdict: for the arithmetic
evaluations of a real-model sweep (config/real-cpu.yaml), per evaluation file, the share of
answers that

- math_verify grades correct (the reward of config/real-cpu.yaml),
- math_verify_boxed grades correct (the last \\boxed{} only),
- hold a \\boxed{} at all, and the share of math_verify's failures that hold none,
- end on the right number (the last number in the text equals the gold answer),
- are graded correct for an expression rather than a number (math-verify evaluated, e.g.,
  "58 - 36" out of "16 is 58 - 36.": the question restated),
- were cut off at max_new_tokens, and their mean length in tokens.

    python tools/answer_forms.py docs/runs/real-cpu/samples      # a snapshot's samples
    python tools/answer_forms.py results/real-cpu                 # a sweep's evaluations

docs/results.md, "A real model on a laptop", quotes its output.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

HEADINGS = {"math_verify": "math_verify", "math_verify_boxed": "mv_boxed", "has_box": "has box",
            "failures_without_box": "fails no box", "last_number_right": "last number",
            "credited_expression": "expression", "cut_off": "cut off", "tokens": "tokens"}
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
EXPRESSION = re.compile(r"\d\s*(?:[-+*/]|\\times|\\cdot)\s*\d")


def last_number(text: str) -> str | None:
    found = NUMBER.findall(text.replace(",", ""))
    return found[-1] if found else None


def forms(rows: list[dict]) -> dict[str, float]:
    """The shares above for one evaluation's per-sample records (eval/run.py's jsonl)."""
    n = len(rows)
    lenient = [bool(r["scorers"]["math_verify"]["correct"]) for r in rows]
    fails = [r for r, ok in zip(rows, lenient) if not ok]
    return {
        "math_verify": sum(lenient) / n,
        "math_verify_boxed": sum(bool(r["scorers"]["math_verify_boxed"]["correct"])
                                 for r in rows) / n,
        "has_box": sum("\\boxed" in r["completion"] for r in rows) / n,
        "failures_without_box": sum("\\boxed" not in r["completion"] for r in fails)
        / max(1, len(fails)),
        "last_number_right": sum(last_number(r["completion"]) == str(r["gold"])
                                 for r in rows) / n,
        "credited_expression": sum(ok and bool(EXPRESSION.search(
            r["scorers"]["math_verify"]["extracted"] or "")) for r, ok in zip(rows, lenient)) / n,
        "cut_off": sum(r["finish_reason"] == "length" for r in rows) / n,
        "tokens": sum(r["num_tokens"] for r in rows) / n,
    }


def read(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f]


def files(root: Path) -> list[Path]:
    """A snapshot's samples/*.jsonl.gz, or a sweep's initial and per-run arithmetic.jsonl."""
    found = sorted(root.glob("*arithmetic.jsonl.gz"))
    return found or sorted(root.glob("**/eval/step_*/arithmetic.jsonl"))


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print(__doc__.split("\n\n")[2], file=sys.stderr)
        return 2
    root = Path(argv[0])
    paths = files(root)
    if not paths:
        print(f"error: no arithmetic evaluations under {root}", file=sys.stderr)
        return 2
    keys = list(forms(read(paths[0])))
    print("file".ljust(48) + "".join(HEADINGS[k].rjust(13) for k in keys))
    for path in paths:
        shares = forms(read(path))
        cells = [f"{shares[k]:.1f}" if k == "tokens" else f"{100 * shares[k]:.1f}%" for k in keys]
        print(str(path.relative_to(root)).ljust(48) + "".join(c.rjust(13) for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
