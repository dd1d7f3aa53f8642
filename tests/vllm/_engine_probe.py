"""Run as a script (one vLLM engine per process, vLLM's rule): three checks on one engine
start-up, each printing one line, exit 0 only when all pass.

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
3. Folder reload (tensor parallelism's push, `reload_from_folder`): the weights written once
   to a hand-off folder and reloaded by every vLLM worker through
   `collective_rpc("reload_weights", weights_path=...)`, vLLM's own in-place reload; here
   on the one in-process worker, the call a `mp` executor sends each GPU's worker. vLLM
   then samples from those weights, every name was written (a tied head's as its own
   copy: safetensors refuses shared storage), and the folder is gone.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from common.generation import EngineOptions, start_engine
from common.generation.base import model_weights
from common.generation.vllm import (
    AdapterHandOff,
    reload_from_folder,
    vllm_requests,
    vllm_sampling_params,
)
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
    model = changed(model_path, seed=0)
    engine.sync_weights(model)
    worker.reload_weights = reload
    del engine.llm.collective_rpc  # the class's own again
    if not received or {pid for pid, _ in received} != {os.getpid()}:
        print(f"weights reached processes {sorted({pid for pid, _ in received})}, "
              f"not only {os.getpid()}")
        return False
    gap = sampler_gap(engine, model)
    print(f"pushed {len(received)} tensors in process {os.getpid()}; "
          f"max log-prob gap {gap:.2e}")
    return gap < 1e-4


def changed(model_path: str, seed: int):
    """The model with every weight moved by seeded noise (tied weights move together)."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model


def sampler_gap(engine, model) -> float:
    """The largest gap between vLLM's log-probs of a sampled answer and `model`'s."""
    tok = engine.tokenizer
    prompt = build_prompt("Compute 2 + 3 * 4.", "dapo", tok)
    [[sample]] = engine.generate([prompt], n=1, temperature=1.0, top_p=1.0, max_new_tokens=8,
                                 seed=0)
    ids = torch.tensor([encode_prompts(tok, [prompt])[0] + sample.token_ids])  # (1, L + T)
    with torch.no_grad():
        logits = model(ids).logits[0, -len(sample.token_ids) - 1 : -1]  # (T, V)
    logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(sample.token_ids)[:, None])
    return max(abs(a - b) for a, b in zip(logp[:, 0].tolist(), sample.logprobs))


def folder_reload_reaches_the_sampler(engine, model_path: str, root: str) -> bool:
    calls = []
    rpc = engine.llm.collective_rpc

    def spy(method, timeout=None, args=(), kwargs=None):
        calls.append((method, dict(kwargs or {})))
        names = safetensors_names(kwargs["weights_path"])
        calls[-1][1]["names"] = names
        return rpc(method, timeout, args, kwargs)

    engine.llm.collective_rpc = spy
    model = changed(model_path, seed=1)
    folder = reload_from_folder(engine.llm, model_weights(model), AdapterHandOff(shm=Path(root)))
    engine.llm.reset_prefix_cache()
    gap = sampler_gap(engine, model)
    names = calls[0][1]["names"] if calls else []
    expected = sorted(name for name, _ in model_weights(model))  # a tied head's name too
    ok = (len(calls) == 1 and calls[0][0] == "reload_weights" and not folder.exists()
          and calls[0][1]["weights_path"] == str(folder) and sorted(names) == expected
          and gap < 1e-4)
    print(f"folder reload: {calls[0][0] if calls else None} from {folder.name} "
          f"({len(names)} of {len(expected)} tensors), removed {not folder.exists()}, "
          f"max log-prob gap {gap:.2e}")
    return ok


def safetensors_names(folder: str) -> list[str]:
    from safetensors import safe_open

    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        return list(f.keys())


def main(model_path: str, root: str) -> int:
    engine = start_engine("vllm", model_path, EngineOptions(dtype="float32", seed=0))
    ids_ok = same_prompt_ids(engine)
    push_ok = push_stays_in_process_and_reaches_the_sampler(engine, model_path)
    folder_ok = folder_reload_reaches_the_sampler(engine, model_path, root)
    return 0 if ids_ok and push_ok and folder_ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
