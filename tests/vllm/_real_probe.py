"""Run as a script by test_real_model.py (one vLLM engine per process, vLLM's rule): the real
SmolLM2-135M-Instruct checkpoint (converted by trainer.pretrained) sampled by vLLM on the CPU
in float32 through the project's engine, then scored by transformers. Prints one JSON line:

- stops: how many samples ended on a stop, and whether each of those ends on <|im_end|>
  (the tokenizer's eos) with no <|im_end|> before it;
- gap_mean, gap_max: |vLLM's log-prob - transformers' log-prob| of every sampled token
  (transformers on the ids vLLM sampled, packed as the trainer packs them);
- samples: the prompt and sampled ids per sample, for the test's own checks.

    python tests/vllm/_real_probe.py MODEL_DIR
"""

from __future__ import annotations

import json
import sys

import torch
from transformers import AutoModelForCausalLM

from common.arithmetic import problems
from common.generation import EngineOptions, start_engine
from common.prompts import build_prompt, encode_prompts
from trainer.logprobs import pack, response_logprobs


def main(model_dir: str) -> None:
    engine = start_engine("vllm", model_dir, EngineOptions(dtype="float32", seed=0))
    tok = engine.tokenizer
    texts = [build_prompt(p["problem"], "boxed", tok) for p in problems("test", 8, seed=2)]
    samples = engine.generate(texts, n=2, temperature=1.0, top_p=1.0, max_new_tokens=64, seed=1)
    engine.close()
    prompt_ids = encode_prompts(tok, texts)
    flat = [(prompt_ids[i], s) for i, group in enumerate(samples) for s in group]
    eos = tok.eos_token_id
    stopped = [s for _, s in flat if s.finish_reason == "stop"]
    at_eos = all(s.token_ids[-1] == eos and eos not in s.token_ids[:-1] for s in stopped)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    batch = pack([p for p, _ in flat], [list(s.token_ids) for _, s in flat], tok.pad_token_id)
    with torch.no_grad():
        hf = response_logprobs(model, batch)[0]
    gaps = torch.cat([(hf[i, : len(s.logprobs)] - torch.tensor(s.logprobs)).abs()
                      for i, (_, s) in enumerate(flat)])
    print(json.dumps({"stops": len(stopped), "stops_at_im_end": at_eos, "eos": eos,
                      "gap_mean": float(gaps.mean()), "gap_max": float(gaps.max()),
                      "samples": [{"prompt_ids": p, "token_ids": list(s.token_ids),
                                   "finish_reason": s.finish_reason, "text": s.text}
                                  for p, s in flat]}))


if __name__ == "__main__":
    main(sys.argv[1])
