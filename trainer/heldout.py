"""Held-out accuracy of a policy on the toy task's test split (the learning target).

    python -m trainer heldout --model DIR --n 4          # sampled mean accuracy, T=1.0
    python -m trainer heldout --model DIR --greedy

"Held-out accuracy" in this project's reports is the sampled (temperature 1.0) mean
accuracy over `n` samples per problem on the whole held-out pool,
`common.toy.problems("test", 121, seed=0)`, graded by the shared dapo scorer: the
Mean@n that evaluation reports.
"""

from __future__ import annotations

import math

import numpy as np

from common.generation.hf import hf_generate
from common.grading import grade_many
from common.prompts import build_prompt


def heldout_accuracy(model, tokenizer, problems: list[dict], *, n: int, temperature: float,
                     max_new_tokens: int, seed: int = 0, template: str = "dapo",
                     scorer: str = "dapo") -> float:
    """Mean accuracy of `n` samples per problem (temperature 0 = greedy), graded like eval."""
    prompts = [build_prompt(p["problem"], template, tokenizer) for p in problems]
    samples = hf_generate(model, tokenizer, prompts, n=n, temperature=temperature, top_p=1.0,
                          max_new_tokens=max_new_tokens, seed=seed, batch_size=512)
    texts = [s.text for group in samples for s in group]
    golds = [p["answer"] for p in problems for _ in range(n)]
    results = grade_many(texts, golds, scorer)
    return float(np.mean([r.correct for r in results])) if results else math.nan
