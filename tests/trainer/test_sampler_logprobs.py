"""The sampler's log-probs mu the correction uses, and the engine dtype `rollout.vllm_dtype`
chooses."""

import pytest
import torch

from common.generation.base import forward_dtype
from common.generation.vllm import VLLMEngine
from trainer.config import RolloutConfig
from trainer.rollout import logprob_gap, sampler_logprobs


def test_mu_is_the_engines_log_probs_where_it_returns_them():
    trainer = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.25, 0.0]])
    mu = sampler_logprobs([[-1.5, -2.5, -3.5], [-0.75]], trainer)
    assert torch.equal(mu, torch.tensor([[-1.5, -2.5, -3.5], [-0.75, -0.25, 0.0]]))
    assert torch.equal(trainer[1], torch.tensor([-0.5, -0.25, 0.0]))  # not written into
    # the hf engine returns none: mu is pi_old itself (every correction is the identity)
    assert sampler_logprobs([None, None], trainer) is trainer
    assert sampler_logprobs(None, trainer) is trainer


def test_the_log_prob_gap_is_measured_on_the_sampled_tokens_only():
    trainer = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.25, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    mu = sampler_logprobs([[-1.5, -2.0, -2.0], [-0.75]], trainer)
    # |gaps| on the 4 sampled tokens: 0.5, 0, 1, 0.25
    assert logprob_gap(mu, trainer, mask) == {"rollout_logprob_gap_mean": 1.75 / 4,
                                              "rollout_logprob_gap_max": 1.0}
    # the hf engine returns no log-probs: no gap to measure
    assert logprob_gap(sampler_logprobs(None, trainer), trainer, mask) == {
        "rollout_logprob_gap_mean": None, "rollout_logprob_gap_max": None}


def test_vllm_dtype_overrides_the_trainers_dtype():
    model = torch.nn.Linear(2, 2)  # float32 weights
    assert forward_dtype(model, None) == "float32"
    assert forward_dtype(model, torch.bfloat16) == "bfloat16"
    assert forward_dtype(model, None, "bfloat16") == "bfloat16"
    assert forward_dtype(model, torch.float16, "float32") == "float32"


@pytest.mark.parametrize("vllm_dtype, expected", [(None, "float32"), ("bfloat16", "bfloat16")])
def test_the_vllm_rollout_engine_is_started_in_rollout_vllm_dtype(vllm_dtype, expected):
    """The decision VLLMEngine.for_rollout makes, without starting vLLM: the dtype it is
    constructed with."""
    seen = {}

    class Recorder(VLLMEngine):
        def __init__(self, model_path, tokenizer, **kwargs):
            seen.update(kwargs)

    cfg = RolloutConfig(engine="vllm", vllm_dtype=vllm_dtype)
    Recorder.for_rollout(cfg, torch.nn.Linear(2, 2), None, model_path="m", seed=0)
    assert seen["dtype"] == expected and seen["sleep_between"] is True
