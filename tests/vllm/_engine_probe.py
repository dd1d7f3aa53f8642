"""Run as a script (one vLLM engine per process, vLLM's rule): two checks on one engine
start-up, each printing one line, exit 0 only when both pass.

1. Prompt ids: vLLM's record of each toy prompt's token ids equals the ids the hf engine
   feeds transformers (its left-padded batch with the padding removed).
2. Weight push: push a changed model's weights into the engine the way the trainer does
   (`Engine.sync_weights`). The push must never cross a process boundary: vLLM V1 with its
   engine core in a child process msgpack-serializes `collective_rpc` calls, refusing a
   function (unless VLLM_ALLOW_INSECURE_SERIALIZATION=1) and copying every tensor to the
   host and over ZMQ. So this checks that the engine core is in this process, that
   `collective_rpc` is never called, that every tensor reaches the worker in this process
   id, and that vLLM then samples from the pushed weights (its log-probs equal the changed
   model's). Check 1 ran first, so the prefix cache holds KV of the old weights: a push
   that does not drop it shows up as a log-prob gap too.
"""

from __future__ import annotations

import os
import sys

import torch
from transformers import AutoModelForCausalLM

from common.generation import EngineOptions, start_engine
from common.generation.vllm import vllm_requests, vllm_sampling_params
from common.prompts import build_prompt, encode_prompts
from eval.benchmarks import load_benchmark


def same_prompt_ids(engine) -> bool:
    tok = engine.tokenizer
    problems = load_benchmark("toy").problems
    prompts = [build_prompt(p["problem"], "dapo", tok) for p in problems]
    outputs = engine.llm.generate(vllm_requests(tok, prompts),
                                   vllm_sampling_params(1, 1.0, 1.0, 1, 0), use_tqdm=False)
    # the hf engine's encoding: one left-padded batch, chat text without added special tokens.
    side, tok.padding_side = tok.padding_side, "left"
    enc = tok(prompts, padding=True, add_special_tokens=False)
    tok.padding_side = side
    hf_ids = [[t for t, m in zip(ids, mask) if m]
              for ids, mask in zip(enc["input_ids"], enc["attention_mask"])]
    bad = [i for i, (o, h) in enumerate(zip(outputs, hf_ids)) if list(o.prompt_token_ids) != h]
    if bad:
        print(f"prompt ids differ for prompts {bad[:10]}")
        return False
    print(f"identical prompt ids for {len(prompts)} prompts")
    return True


def push_stays_in_process_and_reaches_the_sampler(engine, model_path: str) -> bool:
    tok = engine.tokenizer
    core = type(engine.llm.llm_engine.engine_core).__name__
    if core != "InprocClient":
        print(f"engine core client is {core}, not in-process")
        return False

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
        return False

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
    return gap < 1e-4


def main(model_path: str) -> int:
    engine = start_engine("vllm", model_path, EngineOptions(dtype="float32", seed=0))
    ids_ok = same_prompt_ids(engine)
    push_ok = push_stays_in_process_and_reaches_the_sampler(engine, model_path)
    return 0 if ids_ok and push_ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
