"""lighteval custom tasks over our local benchmark JSONL, for cross-checking `python -m eval`.

Runs in its own virtual environment (lighteval pins latex2sympy2_extended and vllm versions
that conflict with math-verify in the main one); see the README section "lighteval
cross-check". Problems, answers and prompt templates are the ones `python -m eval` uses:
the JSONL files in RPG_BENCHMARK_DIR (default: the data/benchmarks/ folder the repository ships)
and eval/prompts.py (imported by path; it has no dependencies).

    lighteval accelerate "model_name=CKPT,dtype=float32" "aime24_local|0" \\
        --custom-tasks eval/lighteval/tasks.py --output-dir OUT
    python -m eval convert-lighteval OUT/results/.../results_*.json --out summary.json

Environment: RPG_BENCHMARK_DIR, RPG_TEMPLATE (dapo|boxed, default dapo), RPG_N (samples
per problem, default 32), RPG_MAX_NEW_TOKENS (default 8192).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from lighteval.metrics.metrics import Metrics
from lighteval.tasks.lighteval_task import LightevalTaskConfig
from lighteval.tasks.requests import Doc

REPO = Path(__file__).resolve().parents[2]
BENCHMARK_DIR = Path(
    os.environ.get("RPG_BENCHMARK_DIR", REPO / "data" / "benchmarks")
).resolve()
TEMPLATE = os.environ.get("RPG_TEMPLATE", "dapo")
N = int(os.environ.get("RPG_N", "32"))
MAX_NEW_TOKENS = int(os.environ.get("RPG_MAX_NEW_TOKENS", "8192"))

# pass@k for k = 1, 2, 4, ... <= N, the ks `python -m eval` reports (plus N itself there).
_KS = [2**i for i in range(N.bit_length()) if 2**i <= N]

_spec = importlib.util.spec_from_file_location("rpg_prompts", REPO / "eval" / "prompts.py")
_prompts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_prompts)


def _prompt(line: dict, task_name: str | None = None) -> Doc:
    return Doc(
        task_name=task_name,
        query=_prompts.render(line["problem"], TEMPLATE),
        choices=[str(line["answer"])],
        gold_index=0,
    )


def _task(name: str) -> LightevalTaskConfig:
    # datasets loads every *.jsonl of the folder as one "train" split; keep this benchmark's
    # rows by their id prefix ("aime24-00", ...).
    return LightevalTaskConfig(
        name=f"{name}_local",
        prompt_function=_prompt,
        hf_repo=str(BENCHMARK_DIR),
        hf_subset="default",
        hf_filter=lambda row, prefix=f"{name}-": str(row["id"]).startswith(prefix),
        hf_avail_splits=["train"],
        evaluation_splits=["train"],
        few_shots_split=None,
        few_shots_select=None,
        generation_size=MAX_NEW_TOKENS,
        metrics=[Metrics.avg_at_n_math(sample_params={"n": N})]
        + [Metrics.pass_at_k_math(sample_params={"k": k, "n": N}) for k in _KS],
        version=0,
    )


TASKS_TABLE = [_task(name) for name in ("aime24", "aime25", "amc23")]
