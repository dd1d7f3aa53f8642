"""A generated question family's two splits, cut once and drawn from deterministically: the
machinery `common.toy` and `common.arithmetic` share (common.generated lists them)."""

from __future__ import annotations

import random
from collections.abc import Sequence

SPLITS = ("train", "test")


class QuestionPools:
    """`items` shuffled once with `name`'s fixed seed and cut into a held-out pool (the first
    `test_fraction`) and a training pool, so a training draw never repeats a held-out item."""

    def __init__(self, name: str, items: Sequence, test_fraction: float) -> None:
        self.name = name
        items = list(items)
        random.Random(f"{name}-split-v1").shuffle(items)
        n_test = int(len(items) * test_fraction)
        self.pools = {"test": items[:n_test], "train": items[n_test:]}

    def _pool(self, split: str) -> list:
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is not a {self.name} split; choose one of {SPLITS}")
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
