"""One update on a fixed global batch, at whatever world size this is launched with.

    python tests/distributed/dist_update_script.py CONFIG OUT          # world size 1
    torchrun --nproc-per-node 2 tests/distributed/dist_update_script.py CONFIG OUT

The batch (prompts, responses, rewards) is built from a fixed seed, identically on every
rank; rank 0 saves the loss metrics, the first mini-batch's full gradients (taken before
the optimizer touches them) and the full updated weights to OUT (torch.save).

Adam runs with eps = 1: its step lr * m / (sqrt(v) + eps) is then Lipschitz in the
gradient (constant ~lr), so gradients equal to float32 reduction noise give weights equal
to float32 noise at any world size and on any CPU kernel. With the default eps = 1e-8 the
first step moves a weight by ~lr whatever its gradient's size, so a near-zero gradient's
noisy sign decides a 1e-3 move, and no tolerance below lr is honest.
"""

from __future__ import annotations

import sys

import torch

from algorithms import compute_advantages
from trainer import distributed
from trainer.config import load_run_config
from trainer.logprobs import pack
from trainer.loop import Trainer


def fixed_batch(vocab: int, rows: int, n: int, device):
    gen = torch.Generator().manual_seed(1234)
    prompts, responses = [], []
    for _ in range(rows):
        p = torch.randint(4, vocab, (int(torch.randint(3, 9, (1,), generator=gen)),), generator=gen)
        r = torch.randint(4, vocab, (int(torch.randint(1, 13, (1,), generator=gen)),), generator=gen)
        prompts.append(p.tolist())
        responses.append(r.tolist())
    rewards = torch.randint(0, 2, (rows,), generator=gen).float() * 2 - 1
    groups = torch.arange(rows // n).repeat_interleave(n)
    return pack(prompts, responses, pad_id=0).to(device), rewards.to(device), groups.to(device)


LINEAR_ADAM_EPS = 1.0


def record_first_gradients(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Wrap the optimizer's step so the first call first copies the full (unsharded)
    gradient of every parameter; a collective under FSDP2, so every rank runs it."""
    grads: dict[str, torch.Tensor] = {}
    step = trainer.optimizer.step

    def recording_step(*args, **kwargs):
        if not grads:
            for name, p in trainer.policy.named_parameters():
                if p.grad is None:  # frozen (LoRA's base weights)
                    continue
                g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                grads[name.removeprefix("module.")] = g.detach().cpu().clone()
        return step(*args, **kwargs)

    trainer.optimizer.step = recording_step
    return grads


def main(config: str, out: str) -> None:
    trainer = Trainer(load_run_config(config))
    trainer.setup(track=False)
    for group in trainer.optimizer.param_groups:
        group["eps"] = LINEAR_ADAM_EPS
    grads = record_first_gradients(trainer)
    trainer.global_step = 1
    batch, rewards, groups = fixed_batch(trainer.model.config.vocab_size, 16, 4, trainer.device)
    old_logp, _ = trainer.updater.logprobs_no_grad(trainer.policy, batch, with_entropy=False)
    adv = compute_advantages(rewards, groups, trainer.method.advantage, mask=batch.response_mask)
    metrics = trainer.updater.update(batch, old_logp, None, adv)
    weights = distributed.model_state(trainer.policy)
    if trainer.world.main:
        torch.save({"metrics": metrics, "weights": weights, "old_logp": old_logp,
                    "grads": grads}, out)
    distributed.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
