"""Generation engines behind one interface (`Engine`), registered by name.

    from common.generation import EngineOptions, start_engine
    engine = start_engine("hf", "results/x/runs/r/checkpoints/step_40", EngineOptions())
    samples = engine.generate(prompts, n=4, temperature=1.0, top_p=1.0,
                              max_new_tokens=256, seed=0)    # list (prompts) of list (n)
    engine.load_checkpoint("results/x/runs/r/checkpoints/step_80")   # swap weights in place

Adding an engine (e.g. SGLang) is one class in one file: subclass `base.Engine`, set
`name`, implement `from_checkpoint`, `generate` and `load_weights` (and `sleep`/`wake` if it
can release memory; `for_rollout` if a training run should start it other than from the
run's checkpoint), decorate it with `@register_engine`, and import its module below.
Every list of engine names (the eval CLI's choices, the trainer's `rollout.engine`, the
sweep's `eval.backend`) is `ENGINES`, an `algorithms.registry.Registry`.
"""

from __future__ import annotations

from pathlib import Path

# The built-in engines register themselves on import (their heavy libraries, e.g. vllm,
# are imported only when one starts).
from common.generation import hf as _hf  # noqa: F401
from common.generation import vllm as _vllm  # noqa: F401
from common.generation.base import (
    ENGINES,
    Engine,
    EngineOptions,
    Sample,
    check_checkpoint,
    register_engine,
)


def start_engine(name: str, checkpoint: str | Path, options: EngineOptions) -> Engine:
    """Start engine `name` on an HF checkpoint directory."""
    return ENGINES.get(name).from_checkpoint(checkpoint, options)


__all__ = ["ENGINES", "Engine", "EngineOptions", "Sample", "check_checkpoint",
           "register_engine", "start_engine"]
