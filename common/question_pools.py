"""A generated question family's splits, cut once and drawn from deterministically: the
machinery `common.toy` and `common.arithmetic` share (common.generated lists them)."""

from __future__ import annotations

import random
from collections.abc import Sequence

SPLITS = ("train", "validation", "test")


class QuestionPools:
    """`items` shuffled once with `name`'s fixed seed and cut into a held-out pool (the first
    `test_fraction`), a validation pool (the next `validation_fraction`, none by default)
    and a training pool (the rest), so a training draw never repeats a held-out or a
    validation item, and settings tuned on the validation pool never see the held-out one.
    The held-out pool is the same with or without a validation pool: it is cut first."""

    def __init__(self, name: str, items: Sequence, test_fraction: float,
                 validation_fraction: float = 0.0) -> None:
        self.name = name
        items = list(items)
        random.Random(f"{name}-split-v1").shuffle(items)
        n_test = int(len(items) * test_fraction)
        n_val = int(len(items) * validation_fraction)
        self.pools = {"test": items[:n_test], "validation": items[n_test:n_test + n_val],
                      "train": items[n_test + n_val:]}

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(s for s in SPLITS if self.pools[s])

    def _pool(self, split: str) -> list:
        if split not in self.splits:
            raise ValueError(f"split={split!r} is not a {self.name} split; choose one of "
                             f"{self.splits}")
        return self.pools[split]

    def size(self, split: str) -> int:
        return len(self._pool(split))

    def draw(self, split: str, n: int, seed: int = 0) -> list:
        """`n` items of `split`: distinct while `n` is at most the pool, the pool cycled in
        fresh shuffles beyond; deterministic for (split, n, seed)."""
        pool = self._pool(split)
        if n < 0:
            raise ValueError(f"n={n} must be >= 0")
        rng = random.Random(f"{self.name}-{split}-{seed}")
        order: list = []
        while len(order) < n:
            chunk = list(pool)
            rng.shuffle(chunk)
            order.extend(chunk)
        return order[:n]
