"""Worker side of the math-verify process pool (see `common.grading`).

Started by the parent as `python <this file>`; speaks JSON lines on stdin/stdout (no pickle,
and no re-import of the parent's __main__ as multiprocessing would do). Runs in a child
process: math-verify's own timeouts rely on SIGALRM, which only works on a
main thread, so they are disabled here and the parent enforces a per-item wall-clock limit
by killing the worker. Nothing from a completion is executed; math-verify parses LaTeX and
plain expressions into sympy objects and compares them.
"""

from __future__ import annotations

import json
import logging
import os
import sys

from math_verify import LatexExtractionConfig, parse, verify

# math-verify warns on every call when its timeouts are disabled; we disable them on purpose.
logging.getLogger("math_verify").setLevel(logging.ERROR)
# Replies stay small even when a huge completion parses into a huge expression.
MAX_EXTRACTED_CHARS = 2000
# Anchored extraction (a strict scorer's): LaTeX in a \boxed{} only. The library's default
# also reads bare LaTeX and bare numbers anywhere ("try_extract_without_anchor") and falls
# back to the raw string, so "\boxed{? 80}" would read 80 (open-r1's accuracy reward turns
# the same switch off).
ANCHORED = [LatexExtractionConfig(try_extract_without_anchor=False, boxed_match_priority=0)]


def gold_text(gold: str) -> str:
    """Gold answers are bare ("540", "\\frac{1}{2}"); wrapping them in a box makes
    math-verify's LaTeX extractor read the whole string as one answer."""
    if "\\boxed" in gold or "$" in gold:
        return gold
    return "\\boxed{" + gold + "}"


def _value(expr):
    """What an answer states: the right side of an equation ("41 + 16 = 57" states 57)."""
    return expr.rhs if getattr(expr, "is_Relational", False) else expr


def computed(gold_parsed: list, pred: list) -> bool:
    """A number gold is matched only by a written number: "\\boxed{32 + 48}" restates the
    question "What is 32 + 48?" and sympy would evaluate it to the gold 80."""
    if not getattr(gold_parsed[0], "is_Number", False):
        return True
    return bool(getattr(_value(pred[0]), "is_Number", False))


def grade_one(completion: str, gold: str, strict: bool = False) -> tuple[bool, str | None, str]:
    """(correct, extracted, status) for one completion; status in ok/no_answer/error.
    `strict`: `completion` is the extract itself (a \\boxed{...}), read with ANCHORED, no
    fallback, and a number gold needs a number (`computed`)."""
    try:
        gold_parsed = parse(gold_text(gold), parsing_timeout=None)
        if not gold_parsed:
            return False, None, "error"
        if strict:
            pred = parse(completion, ANCHORED, fallback_mode="no_fallback", parsing_timeout=None)
        else:
            pred = parse(completion, parsing_timeout=None)
        if not pred:
            return False, None, "no_answer"
        # Gold first: math-verify's comparison is asymmetric (e.g. sets vs intervals).
        correct = bool(verify(gold_parsed, pred, timeout_seconds=None))
        if strict:
            correct = correct and computed(gold_parsed, pred)
        extracted = str(pred[1]) if len(pred) > 1 else str(pred[0])
        return correct, extracted, "ok"
    except Exception:  # noqa: BLE001 - any failure on model output is a graded "error"
        return False, None, "error"


def serve() -> None:
    """Answer JSON-line requests {"i", "completion", "gold", "strict"} on stdin until EOF.

    Replies go to a private copy of the original stdout; fd 1 is pointed at stderr so
    that anything a library prints cannot corrupt the protocol.
    """
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    replies.write('{"ready": true}\n')
    replies.flush()
    for line in sys.stdin:
        request = json.loads(line)
        correct, extracted, status = grade_one(request["completion"], request["gold"],
                                              bool(request.get("strict")))
        if extracted is not None and len(extracted) > MAX_EXTRACTED_CHARS:
            extracted = extracted[:MAX_EXTRACTED_CHARS] + "..."
        reply = {"i": request["i"], "correct": correct, "extracted": extracted, "status": status}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    serve()
