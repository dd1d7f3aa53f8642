"""The vLLM engine's call protocol and weight push, against a stand-in that records calls.

vLLM cannot be installed here (no GPU); the stand-in implements only the LLM methods the
engine uses (sleep, wake_up, generate, collective_rpc, reset_prefix_cache) and returns
objects shaped like vLLM's RequestOutput/CompletionOutput.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainer.rollout import VLLMEngine


class StandInLLM:
    def __init__(self):
        self.calls: list[tuple] = []

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def collective_rpc(self, method, args=()):
        self.calls.append(("collective_rpc", method, args))

    def generate(self, requests, params, use_tqdm=True):
        self.calls.append(("generate", requests, params))
        return [SimpleNamespace(outputs=[
            SimpleNamespace(token_ids=[7, 8], text=f"r{i}-{j}",
                            finish_reason="stop" if j == 0 else "length")
            for j in range(params["n"])]) for i in range(len(requests))]


def sampling_params(n, temperature, top_p, max_new_tokens, seed):
    return {"n": n, "temperature": temperature, "top_p": top_p, "max_tokens": max_new_tokens,
            "seed": seed}


def test_generate_translates_requests_and_sleeps_between_rollouts(tiny_dir):
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    llm = StandInLLM()
    engine = VLLMEngine(str(tiny_dir), tok, temperature=1.0, top_p=0.9, max_new_tokens=16,
                        seed=0, llm=llm, sampling_params=sampling_params)
    assert llm.calls == [("sleep", 1)]
    prompts = ["<|user|>\nhi<|assistant|>\n", "<|user|>\nhello there<|assistant|>\n"]
    samples = engine.generate(prompts, n=2, seed=5)
    kinds = [c[0] for c in llm.calls]
    assert kinds == ["sleep", "wake_up", "generate", "sleep"]
    _, requests, params = llm.calls[2]
    assert params == {"n": 2, "temperature": 1.0, "top_p": 0.9, "max_tokens": 16, "seed": 5}
    # Prompt ids are the trainer's own tokenization (chat text: no extra special tokens).
    assert requests == [{"prompt_token_ids": tok(p, add_special_tokens=False)["input_ids"]}
                        for p in prompts]
    assert [[s.text for s in g] for g in samples] == [["r0-0", "r0-1"], ["r1-0", "r1-1"]]
    assert samples[1][1].finish_reason == "length" and samples[0][0].token_ids == [7, 8]


def test_weight_push_loads_every_tensor_into_the_worker_model(tiny_dir):
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    policy = AutoModelForCausalLM.from_pretrained(tiny_dir)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.5)  # "after an update"
    llm = StandInLLM()
    engine = VLLMEngine(str(tiny_dir), tok, temperature=1.0, top_p=1.0, max_new_tokens=8,
                        seed=0, llm=llm, sampling_params=sampling_params)
    engine.sync_weights(policy)
    kinds = [c[0] for c in llm.calls]
    assert kinds == ["sleep", "wake_up", "collective_rpc", "reset_prefix_cache"]
    assert llm.calls[1] == ("wake_up", ["weights"])  # KV cache stays released
    _, method, (weights,) = llm.calls[2]
    # Run the pushed function on a stand-in worker whose model has vLLM's load_weights.
    engine_model = AutoModelForCausalLM.from_pretrained(tiny_dir)

    def load_weights(weights):
        engine_model.load_state_dict(dict(weights), strict=True)

    worker = SimpleNamespace(model_runner=SimpleNamespace(
        model=SimpleNamespace(load_weights=load_weights)))
    method(worker, weights)
    for a, b in zip(engine_model.state_dict().values(), policy.state_dict().values()):
        assert torch.equal(a, b)
    # The next rollout wakes only the KV cache: the weights are already on the GPU.
    engine.generate(["x"], n=1, seed=0)
    assert llm.calls[4] == ("wake_up", ["kv_cache"])
