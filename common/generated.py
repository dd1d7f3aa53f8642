"""The question families this project generates itself, offline: each a module with a
training split and a held-out split (`problems(split, n, seed)`, `pool_size(split)`).

One registry serves both ends: `task.kind: <name>` trains on its `train` split
(trainer.tasks), and the benchmark `<name>` evaluates every question of its `test` split
(eval.benchmarks), so a generated task's held-out score never repeats a training question.

    toy          "Compute a + b * c." for the tiny model (common.toy)
    arithmetic   two-digit sums, differences, products in words, for a small real model
                 (common.arithmetic)
"""

from __future__ import annotations

from types import ModuleType

from algorithms.registry import Registry
from common import arithmetic, toy

GENERATED: Registry[ModuleType] = Registry("generated task")
GENERATED.register("toy", toy)
GENERATED.register("arithmetic", arithmetic)
