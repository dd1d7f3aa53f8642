"""Synthetic verifiable arithmetic task for the tiny offline default.

Problems are short integer expressions; the gold answer is their value. Splits are
disjoint by construction (a split name is mixed into the seed and held-out problems are
filtered against the training set), so held-out accuracy measures generalisation.
"""

from __future__ import annotations

import random

SPLITS = ("train", "test")


def _expression(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(1, 20), rng.randint(1, 20), rng.randint(1, 9)
    op = rng.choice(["+", "-"])
    value = a + b * c if op == "+" else a - b * c
    return f"{a} {op} {b} * {c}", value


def problems(split: str, n: int, seed: int = 0) -> list[dict]:
    """`n` problems of `split` as dicts with keys id, problem, answer (answer is a str)."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not a toy split; choose one of {SPLITS}")
    rng = random.Random(f"toy-{split}-{seed}")
    out = []
    for i in range(n):
        expr, value = _expression(rng)
        out.append({"id": f"toy-{split}-{i:05d}", "problem": f"Compute {expr}.", "answer": str(value)})
    return out
