"""Generated arithmetic questions for a small real instruct model (`task.kind: arithmetic`,
benchmark `arithmetic`): sums, differences and products of small whole numbers in plain
words, graded by math-verify on the response's `\\boxed{}` answer.

A problem is one of
    "What is a + b?"   a, b in 10..49       (two-digit addition: 1,600)
    "What is a - b?"   10 <= b < a <= 59    (two-digit subtraction: 1,225)
    "What is a * b?"   a in 2..9, b in 11..19 (one digit by two: 72)
and the gold answer its value as a string. The 2,897 questions are split once,
deterministically, into a held-out pool (20%: 579), a validation pool (10%: 289; the
benchmark `arithmetic_val`, where settings are chosen) and a training pool (70%: 2,029), so
training never sees a held-out or validation question. The held-out pool is the one it was
before the validation pool was cut (common.question_pools cuts it first); the training pool
lost the 289 validation questions. The ranges sit where SmolLM2-135M-Instruct is
often wrong at temperature 1 but not hopeless (docs/results.md "A real model on a laptop"):
a task it already solved would show nothing, one it cannot solve would teach nothing.

    python -c "from common.arithmetic import problems; print(problems('test', 3))"
"""

from __future__ import annotations

from common.question_pools import QuestionPools

TEST_FRACTION = 0.2
VALIDATION_FRACTION = 0.1


def _questions() -> list[tuple[str, int]]:
    out = [(f"What is {a} + {b}?", a + b) for a in range(10, 50) for b in range(10, 50)]
    out += [(f"What is {a} - {b}?", a - b) for a in range(11, 60) for b in range(10, a)]
    out += [(f"What is {a} * {b}?", a * b) for a in range(2, 10) for b in range(11, 20)]
    return out


POOLS = QuestionPools("arithmetic", _questions(), TEST_FRACTION, VALIDATION_FRACTION)


def pool_size(split: str) -> int:
    """How many distinct questions `split` has (579 test, 289 validation, 2,029 train)."""
    return POOLS.size(split)


def problems(split: str, n: int, seed: int = 0) -> list[dict]:
    """`n` questions of `split` as dicts with keys id, problem, answer (a str): distinct
    while `n` is at most the pool, the pool cycled in fresh shuffles beyond; deterministic
    for (split, n, seed)."""
    return [{"id": f"arithmetic-{split}-{i:05d}", "problem": q, "answer": str(v)}
            for i, (q, v) in enumerate(POOLS.draw(split, n, seed))]


CATEGORIES = {"+": "addition", "-": "subtraction", "*": "multiplication"}


def category(question: str) -> str:
    """The operation a question asks for ("addition", "subtraction", "multiplication"): the
    report's accuracy by category (analysis.categories), since the room to learn differs."""
    for sign, name in CATEGORIES.items():
        if f" {sign} " in question:
            return name
    raise ValueError(f"not an arithmetic question of this task: {question!r}")
