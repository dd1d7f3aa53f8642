"""Rollout engines behind one interface: `hf` (the training model's own `generate`) and
`vllm` (a colocated vLLM engine that sleeps between rollouts and receives new weights
after every update).

    engine = make_engine(cfg, model, tokenizer)
    samples = engine.generate(prompts, n=8, seed=step_seed)   # list (prompts) of list (n)
    ...update the model...
    engine.sync_weights(model)                                # vllm: push; hf: nothing

Only token ids and finish reasons are used from an engine: behaviour log-probs are always
recomputed by the training model (trainer.logprobs), never taken from the engine.
"""

from __future__ import annotations

from typing import Protocol

from eval.samplers import Sample, hf_generate, vllm_outputs_to_samples, vllm_sampling_params


class RolloutEngine(Protocol):
    def generate(self, prompts: list[str], *, n: int, seed: int) -> list[list[Sample]]: ...

    def sync_weights(self, model) -> None: ...


class HFEngine:
    """Batched `model.generate` on the training model itself (KV cache, left padding)."""

    def __init__(self, model, tokenizer, *, temperature: float, top_p: float,
                 max_new_tokens: int, batch_size: int) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.temperature, self.top_p = temperature, top_p
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size

    def generate(self, prompts: list[str], *, n: int, seed: int) -> list[list[Sample]]:
        return hf_generate(
            self.model, self.tokenizer, prompts, n=n, temperature=self.temperature,
            top_p=self.top_p, max_new_tokens=self.max_new_tokens, seed=seed,
            batch_size=self.batch_size,
        )

    def sync_weights(self, model) -> None:
        """Nothing to do: the engine samples from the training model's own weights."""


def _load_weights_on_worker(worker, weights) -> None:
    """Runs inside each vLLM worker (via `LLM.collective_rpc`): load (name, tensor) pairs."""
    worker.model_runner.model.load_weights(weights=weights)


class VLLMEngine:
    """A vLLM `LLM` colocated on the training GPU, asleep while the trainer updates.

    Each rollout: `wake_up()` -> `generate()` -> `sleep(level)`. After each update the new
    weights are pushed with `collective_rpc` into the worker's model (`load_weights`, which
    also handles fused/stacked parameter names), then the prefix cache is reset so no KV
    computed under old weights is reused. `llm` may be injected (tests use a stand-in that
    records calls; the real vLLM classes need a GPU), and so may `sampling_params`.
    """

    def __init__(self, model_path: str, tokenizer, *, temperature: float, top_p: float,
                 max_new_tokens: int, seed: int, dtype: str = "bfloat16",
                 gpu_memory_utilization: float = 0.35, max_model_len: int | None = None,
                 sleep_level: int = 1, llm=None, sampling_params=vllm_sampling_params) -> None:
        if llm is None:
            from vllm import LLM  # lazy: vLLM is a GPU-only optional dependency

            llm = LLM(
                model=model_path, dtype=dtype, seed=seed, enable_sleep_mode=True,
                gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                enable_prefix_caching=True,
            )
        self.llm, self.tokenizer = llm, tokenizer
        self.temperature, self.top_p, self.max_new_tokens = temperature, top_p, max_new_tokens
        self.sleep_level = sleep_level
        self.sampling_params = sampling_params
        self.llm.sleep(level=sleep_level)  # free the GPU for the first training step's setup
        self.state = "asleep"  # "asleep" | "weights" (weights on GPU, no KV cache) | "awake"

    def _requests(self, prompts: list[str]) -> list[dict]:
        # Tokenize here with the same rule as hf_generate, so the engine and the trainer see
        # identical prompt ids (chat-formatted text must not get a second BOS).
        add_special = not getattr(self.tokenizer, "chat_template", None)
        return [{"prompt_token_ids": self.tokenizer(p, add_special_tokens=add_special)["input_ids"]}
                for p in prompts]

    def generate(self, prompts: list[str], *, n: int, seed: int) -> list[list[Sample]]:
        params = self.sampling_params(n, self.temperature, self.top_p, self.max_new_tokens, seed)
        if self.state == "asleep":
            self.llm.wake_up()
        elif self.state == "weights":
            self.llm.wake_up(tags=["kv_cache"])  # weights were woken by sync_weights
        self.state = "awake"
        try:
            outputs = self.llm.generate(self._requests(prompts), params, use_tqdm=False)
        finally:
            self.llm.sleep(level=self.sleep_level)  # hand the GPU back to the trainer
            self.state = "asleep"
        return vllm_outputs_to_samples(outputs)

    def sync_weights(self, model) -> None:
        """Push the training model's weights; they stay on the GPU for the next rollout."""
        if self.state == "asleep":
            # Weights only: the KV cache stays released until generate() needs it.
            self.llm.wake_up(tags=["weights"])
            self.state = "weights"
        weights = [(name, t.detach()) for name, t in model.state_dict().items()]
        self.llm.collective_rpc(_load_weights_on_worker, args=(weights,))
        self.llm.reset_prefix_cache()


def make_engine(rollout_cfg, model, tokenizer, *, model_path: str, seed: int,
                dtype: str = "bfloat16", llm=None) -> RolloutEngine:
    """The engine named by `rollout_cfg.engine` (a trainer.config.RolloutConfig)."""
    common = {"temperature": rollout_cfg.temperature, "top_p": rollout_cfg.top_p,
              "max_new_tokens": rollout_cfg.max_new_tokens}
    if rollout_cfg.engine == "hf":
        return HFEngine(model, tokenizer, batch_size=rollout_cfg.gen_batch_size, **common)
    if rollout_cfg.engine == "vllm":
        return VLLMEngine(
            model_path, tokenizer, seed=seed, dtype=dtype,
            gpu_memory_utilization=rollout_cfg.vllm_gpu_memory_utilization,
            max_model_len=rollout_cfg.vllm_max_model_len,
            sleep_level=rollout_cfg.vllm_sleep_level, llm=llm, **common,
        )
    raise ValueError(f"rollout.engine={rollout_cfg.engine!r}; choose 'hf' or 'vllm'")
