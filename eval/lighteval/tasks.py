"""lighteval custom task over one exported benchmark file, for the cross-check stage.

Runs inside lighteval's own virtual environment (workflow/envs/lighteval.txt), never in the
project's: it imports only lighteval. `eval/lighteval/run.py` points it at the folder that
`python -m eval.lighteval_convert export` wrote: one JSONL whose rows hold the problem, the
gold answer and the user message already rendered with our prompt template, so lighteval
sees exactly the problems and prompts that `python -m eval` saw. Chat formatting is
lighteval's: the tokenizer's chat template when it has one, as in our samplers.

Environment (set by run.py): RPG_BENCHMARK (name), RPG_BENCHMARK_DIR (the export folder),
RPG_N (samples per problem), RPG_MAX_NEW_TOKENS.
"""

from __future__ import annotations

import os

from lighteval.metrics.metrics import Metrics
from lighteval.tasks.lighteval_task import LightevalTaskConfig
from lighteval.tasks.requests import Doc

BENCHMARK = os.environ.get("RPG_BENCHMARK", "aime24")
BENCHMARK_DIR = os.environ.get("RPG_BENCHMARK_DIR", "")
N = int(os.environ.get("RPG_N", "32"))
MAX_NEW_TOKENS = int(os.environ.get("RPG_MAX_NEW_TOKENS", "8192"))

# pass@k for k = 1, 2, 4, ... <= N, the ks `python -m eval` reports.
_KS = [2**i for i in range(N.bit_length()) if 2**i <= N]


def _prompt(line: dict, task_name: str | None = None) -> Doc:
    return Doc(task_name=task_name, query=line["query"], choices=[str(line["answer"])],
               gold_index=0)


TASKS_TABLE = [
    LightevalTaskConfig(
        name=f"{BENCHMARK}_local",
        prompt_function=_prompt,
        hf_repo=BENCHMARK_DIR,  # datasets loads the folder's one JSONL as split "train"
        hf_subset="default",
        hf_avail_splits=["train"],
        evaluation_splits=["train"],
        few_shots_split=None,
        few_shots_select=None,
        generation_size=MAX_NEW_TOKENS,
        metrics=[Metrics.avg_at_n_math(sample_params={"n": N})]
        + [Metrics.pass_at_k_math(sample_params={"k": k, "n": N}) for k in _KS],
        version=0,
    )
]
