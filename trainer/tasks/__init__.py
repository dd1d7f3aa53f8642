"""Training tasks: prompts with gold answers, and the verifiable reward.

    problems = load_problems(cfg.task, seed=cfg.seed)       # [{id, problem, answer}]
    rewards, correct = score(texts, golds, cfg.task)        # same grader as evaluation

Rewards come from `common.grading.grade_many`, the code evaluation uses, so a training
reward and an evaluation score can never disagree on the same response.
"""

from __future__ import annotations

from common.generated import GENERATED
from common.grading import grade_many

from .math import load_math_problems

MATH = "math"  # the task kind that reads a data set (a file or a hub id)


def task_kinds() -> list[str]:
    """Every task.kind: the generated question families, and `math` (a data set)."""
    return [*GENERATED, MATH]


def load_problems(task_cfg, seed: int = 0) -> list[dict]:
    """The training problems named by a trainer.config.TaskConfig."""
    if task_cfg.kind in GENERATED:
        return GENERATED.get(task_cfg.kind).problems("train", task_cfg.num_prompts or 2048,
                                                     seed=seed)
    if task_cfg.kind == MATH:
        if not task_cfg.path:
            raise ValueError("task.kind=math needs task.path (a JSONL/parquet file or hub id, "
                             "e.g. BytedTsinghua-SIA/DAPO-Math-17k)")
        return load_math_problems(task_cfg.path, split=task_cfg.split,
                                  problem_key=task_cfg.problem_key,
                                  answer_key=task_cfg.answer_key, limit=task_cfg.num_prompts)
    raise ValueError(f"task.kind={task_cfg.kind!r}; choose one of {task_kinds()}")


def score(texts: list[str], golds: list[str], task_cfg) -> tuple[list[float], list[bool]]:
    """Reward and correctness per response (reward_correct / reward_incorrect)."""
    results = grade_many(texts, golds, task_cfg.scorer)
    correct = [bool(r.correct) for r in results]
    rewards = [task_cfg.reward_correct if c else task_cfg.reward_incorrect for c in correct]
    return rewards, correct
