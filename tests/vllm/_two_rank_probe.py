"""Run as a script, alone or under torchrun: this process's share of the first PROMPTS toy
prompts, generated greedily by its own in-process vLLM engine (the trainer's
`VLLMEngine`, external_launcher under a process group), written to OUT/rank<R>.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from common.generation.vllm import VLLMEngine
from common.prompts import build_prompt
from eval.benchmarks import load_benchmark
from trainer import distributed

PROMPTS = 8


def main(model_path: str, out: str) -> int:
    world = distributed.init("cpu")
    engine = VLLMEngine(model_path, dtype="float32", seed=0, max_model_len=256)
    problems = load_benchmark("toy").problems[:PROMPTS]
    prompts = [build_prompt(p["problem"], "dapo", engine.tokenizer) for p in problems]
    share = len(prompts) // world.size
    mine = list(range(world.rank * share, (world.rank + 1) * share))
    samples = engine.generate([prompts[i] for i in mine], n=1, temperature=0.0, top_p=1.0,
                              max_new_tokens=16, seed=0)
    record = {"rank": world.rank, "world_size": world.size, "prompts": mine,
              "token_ids": [s[0].token_ids for s in samples],
              "executor": type(engine.llm.llm_engine.model_executor).__name__}
    Path(out, f"rank{world.rank}.json").write_text(json.dumps(record))
    engine.close()  # before the process group goes (VLLMEngine.close)
    distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
