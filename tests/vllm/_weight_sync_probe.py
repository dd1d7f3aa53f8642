"""Run as a script (one vLLM engine per process): push a changed model's weights into the
`vllm` engine the way the trainer does (`Engine.sync_weights`) and print what happened.

The weight push must never cross a process boundary: vLLM V1 with its engine core in a
child process msgpack-serializes `collective_rpc` calls, refusing a function (unless
VLLM_ALLOW_INSECURE_SERIALIZATION=1) and copying every tensor to the host and over ZMQ.
So this checks that the engine core is in this process, that `collective_rpc` is never
called, that every tensor reaches the worker in this process id, and that vLLM then
samples from the pushed weights (its log-probs equal the changed model's).
"""

from __future__ import annotations

import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from common.generation.vllm import VLLMEngine
from common.prompts import build_prompt, encode_prompts


def main(model_path: str) -> int:
    tok = AutoTokenizer.from_pretrained(model_path)
    engine = VLLMEngine(model_path, tok, dtype="float32", seed=0, sleep_between=True)
    core = type(engine.llm.llm_engine.engine_core).__name__
    if core != "InprocClient":
        print(f"engine core client is {core}, not in-process")
        return 1

    def refuse(*args, **kwargs):
        raise AssertionError("the weight push went through LLM.collective_rpc")

    engine.llm.collective_rpc = refuse
    worker = engine.llm.llm_engine.model_executor.driver_worker.worker
    received: list[tuple[int, str]] = []
    reload = worker.reload_weights

    def spy(*args, weights_iterator, **kwargs):
        def tap(pairs):
            for name, tensor in pairs:
                received.append((os.getpid(), name))
                yield name, tensor

        return reload(*args, weights_iterator=tap(weights_iterator), **kwargs)

    worker.reload_weights = spy
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    engine.sync_weights(model)
    if not received or {pid for pid, _ in received} != {os.getpid()}:
        print(f"weights reached processes {sorted({pid for pid, _ in received})}, "
              f"not only {os.getpid()}")
        return 1

    prompt = build_prompt("Compute 2 + 3 * 4.", "dapo", tok)
    [[sample]] = engine.generate([prompt], n=1, temperature=1.0, top_p=1.0, max_new_tokens=8,
                                 seed=0)
    ids = torch.tensor([encode_prompts(tok, [prompt])[0] + sample.token_ids])  # (1, L + T)
    with torch.no_grad():
        logits = model(ids).logits[0, -len(sample.token_ids) - 1 : -1]  # (T, V)
    logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(sample.token_ids)[:, None])
    gap = max(abs(a - b) for a, b in zip(logp[:, 0].tolist(), sample.logprobs))
    print(f"pushed {len(received)} tensors in process {os.getpid()}; "
          f"max log-prob gap {gap:.2e}")
    return 0 if gap < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
