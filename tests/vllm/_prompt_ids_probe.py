"""Run as a script (one vLLM engine per process): print whether vLLM's record of each toy
prompt's token ids equals the ids the hf engine feeds transformers (its left-padded batch
with the padding removed)."""

from __future__ import annotations

import sys

from common.generation import EngineOptions, start_engine
from common.generation.vllm import vllm_requests, vllm_sampling_params
from common.prompts import build_prompt
from eval.benchmarks import load_benchmark


def main(model_path: str) -> int:
    engine = start_engine("vllm", model_path, EngineOptions(dtype="float32", seed=0))
    tok = engine.tokenizer
    problems = load_benchmark("toy").problems
    prompts = [build_prompt(p["problem"], "dapo", tok) for p in problems]
    outputs = engine.llm.generate(vllm_requests(tok, prompts),
                                   vllm_sampling_params(1, 1.0, 1.0, 1, 0), use_tqdm=False)
    # the hf engine's encoding: one left-padded batch, chat text without added special tokens.
    tok.padding_side = "left"
    enc = tok(prompts, padding=True, add_special_tokens=False)
    hf_ids = [[t for t, m in zip(ids, mask) if m]
              for ids, mask in zip(enc["input_ids"], enc["attention_mask"])]
    bad = [i for i, (o, h) in enumerate(zip(outputs, hf_ids)) if list(o.prompt_token_ids) != h]
    if bad:
        print(f"prompt ids differ for prompts {bad[:10]}")
        return 1
    print(f"identical prompt ids for {len(prompts)} prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
