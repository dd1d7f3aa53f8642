"""The hf engine's rollouts compute in the trainer's compute dtype (model.compute_dtype):
the log-prob pass recomputes pi_old under that autocast, and the corrections take this
engine's mu to be pi_old, so generation must not run in the float32 master weights' dtype.
Checked on CPU with bfloat16: the layers compute in bf16 while sampling, and the sampled
tokens' log-probs sit with the bf16 recomputation of pi_old (bf16 rounding apart: other
kernel shapes on the KV cache), not with the float32 one."""

from __future__ import annotations

import torch

from common.prompts import build_prompt, encode_prompts
from trainer.logprobs import pack, response_logprobs
from trainer.loop import Trainer

PROBLEMS = ["What is 3 + 4?", "Compute 12 - 5.", "What is 2 * 6?", "What is 9 - 3?"]


def _rollout(trainer: Trainer):
    """Sample 4 x 4 responses with the trainer's own engine; their engine log-probs (B, T)
    and the packed batch."""
    engine = trainer.engine
    engine.engine.logprobs = True  # measurement only: the trainer takes mu = pi_old for hf
    texts = [build_prompt(p, "dapo", trainer.tokenizer) for p in PROBLEMS]
    flat = [s for g in engine.generate(texts, n=4, seed=3) for s in g]
    ids = encode_prompts(trainer.tokenizer, texts)
    batch = pack([ids[i // 4] for i in range(len(flat))], [s.token_ids for s in flat],
                 trainer.tokenizer.pad_token_id)
    mu = torch.zeros_like(batch.response_mask)
    for i, s in enumerate(flat):
        mu[i, : len(s.logprobs)] = torch.tensor(s.logprobs)
    return batch, mu


def test_rollouts_decode_in_the_compute_dtype(make_cfg):
    trainer = Trainer(make_cfg(model={"compute_dtype": "bfloat16"}))
    trainer.setup(track=False)
    seen: list[torch.dtype] = []
    proj = trainer.model.get_decoder().layers[0].self_attn.q_proj
    handle = proj.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    batch, mu = _rollout(trainer)
    handle.remove()
    assert seen and set(seen) == {torch.bfloat16}

    mask = batch.response_mask.bool()
    with torch.no_grad():
        bf16, _ = response_logprobs(trainer.model, batch, autocast=torch.bfloat16)
        fp32, _ = response_logprobs(trainer.model, batch)
    gap_bf16 = (mu - bf16)[mask].abs()
    gap_fp32 = (mu - fp32)[mask].abs()
    # measured: mean 0.0043 / 0.0089, max 0.038 / 0.113 on the shipped tiny model; float32
    # generation against a bf16 pi_old (the old behaviour) is the reverse: 0.0070 / ~2e-6
    assert gap_bf16.mean() < 0.7 * gap_fp32.mean(), (gap_bf16.mean(), gap_fp32.mean())
    assert gap_bf16.max() < 0.1


def test_float32_rollouts_match_pi_old_to_float32_rounding(make_cfg):
    trainer = Trainer(make_cfg())
    trainer.setup(track=False)
    batch, mu = _rollout(trainer)
    with torch.no_grad():
        pi_old, _ = response_logprobs(trainer.model, batch)
    assert (mu - pi_old)[batch.response_mask.bool()].abs().max() < 1e-4
