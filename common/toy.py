"""Synthetic verifiable arithmetic task for the tiny offline default.

A problem is "Compute a + b * c." with a, b in 1..9 and c in 1..5; the gold answer is its
value as a string. The 405 possible expressions are split once, deterministically, into a
held-out pool (30%: 121) and a training pool (70%: 284), so `problems("test", ...)` never
repeats an expression that `problems("train", ...)` can produce. (The ranges are small on
purpose: a ~0.3M-parameter model must learn the arithmetic in a ~40 s warm start.)

`solution(problem)` writes the worked response the tiny model is warm-started on: one
intermediate line, then the DAPO answer line ("Answer: N"), so the shared `dapo` scorer
grades it. `wrong_solution(problem)` is the systematic slip mixed into the warm-start data:
the same working, but a prose last line ("The result is N.") instead of the answer line, so
the verifiable reward cannot extract it. Following the answer format is the habit RL most
reliably fixes in practice; unlike an arithmetic mistake it is a policy-wide choice, so
fixing it on training problems transfers to held-out ones (the tiny model's arithmetic
itself barely generalizes: ~0.5 held-out vs ~0.9 training accuracy with all-correct data).

    python -c "from common.toy import problems; print(problems('test', 3))"
"""

from __future__ import annotations

import re

from common.question_pools import QuestionPools

A_RANGE, B_RANGE, C_RANGE = range(1, 10), range(1, 10), range(1, 6)
TEST_FRACTION = 0.3
_PROBLEM_RE = re.compile(r"^Compute (\d+) \+ (\d+) \* (\d+)\.$")

POOLS = QuestionPools(
    "toy", [(a, b, c) for a in A_RANGE for b in B_RANGE for c in C_RANGE], TEST_FRACTION)


def pool_size(split: str) -> int:
    """How many distinct problems `split` has (121 test, 284 train)."""
    return POOLS.size(split)


def problems(split: str, n: int, seed: int = 0) -> list[dict]:
    """`n` problems of `split` as dicts with keys id, problem, answer (answer is a str):
    distinct while `n` is at most the pool, the pool cycled in fresh shuffles beyond;
    deterministic for (split, n, seed)."""
    return [{"id": f"toy-{split}-{i:05d}", "problem": f"Compute {a} + {b} * {c}.",
             "answer": str(a + b * c)}
            for i, (a, b, c) in enumerate(POOLS.draw(split, n, seed))]


def _parse(problem: str) -> tuple[int, int, int]:
    match = _PROBLEM_RE.match(problem)
    if match is None:
        raise ValueError(f"not a toy problem: {problem!r}")
    a, b, c = (int(x) for x in match.groups())
    return a, b, c


def solution(problem: str) -> str:
    """The correct worked response: the product first, then the DAPO answer line."""
    a, b, c = _parse(problem)
    return f"{b} * {c} = {b * c}\nAnswer: {a + b * c}"


def wrong_solution(problem: str) -> str:
    """The format slip: correct working, but no "Answer:" line for the scorer to find."""
    a, b, c = _parse(problem)
    return f"{b} * {c} = {b * c}\nThe result is {a + b * c}."
