"""The sampler's log-probs mu the correction uses, and the engine dtype `rollout.vllm_dtype`
chooses."""

import torch

from trainer.rollout import engine_dtype, sampler_logprobs


def test_mu_is_the_engines_log_probs_where_it_returns_them():
    trainer = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.25, 0.0]])
    mu = sampler_logprobs([[-1.5, -2.5, -3.5], [-0.75]], trainer)
    assert torch.equal(mu, torch.tensor([[-1.5, -2.5, -3.5], [-0.75, -0.25, 0.0]]))
    assert torch.equal(trainer[1], torch.tensor([-0.5, -0.25, 0.0]))  # not written into
    # the hf engine returns none: mu is pi_old itself (every correction is the identity)
    assert sampler_logprobs([None, None], trainer) is trainer
    assert sampler_logprobs(None, trainer) is trainer


def test_vllm_dtype_overrides_the_trainers_dtype():
    model = torch.nn.Linear(2, 2)  # float32 weights
    assert engine_dtype(model, None) == "float32"
    assert engine_dtype(model, torch.bfloat16) == "bfloat16"
    assert engine_dtype(model, None, "bfloat16") == "bfloat16"
    assert engine_dtype(model, torch.float16, "float32") == "float32"
