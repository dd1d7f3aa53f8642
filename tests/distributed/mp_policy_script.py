"""Gradients of one fixed batch under FSDP2 with a bf16 mixed-precision policy.

    torchrun --nproc-per-node N tests/distributed/mp_policy_script.py MODEL OUT [LOCAL_SIZE]

Every rank builds the same batch, takes its strided share of the rows, and backpropagates
its summed log-probs scaled by the world size (FSDP2 averages over ranks). A world size of
1 is sharded too (a one-rank mesh), so both sides run the same policy. LOCAL_SIZE < N makes
`trainer.distributed` see N / LOCAL_SIZE nodes (an HSDP 2-D mesh). Rank 0 saves the loss,
the full gradients, the dtype the layers computed in and the mesh shape; with LOCAL_SIZE
it also takes one AdamW step and saves how far the weights moved.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from trainer import distributed
from trainer.logprobs import PolicyLogProbs, pack


def fixed_batch(vocab: int, rows: int = 8):
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(4, vocab, (int(n),), generator=gen).tolist()
               for n in torch.randint(2, 7, (rows,), generator=gen)]
    responses = [torch.randint(4, vocab, (int(n),), generator=gen).tolist()
                 for n in torch.randint(1, 9, (rows,), generator=gen)]
    return pack(prompts, responses, pad_id=0)


def main(model_dir: str, out: str, local_size: str | None = None) -> None:
    dist.init_process_group("gloo")
    size, rank = dist.get_world_size(), dist.get_rank()
    world = distributed.World(rank, size, int(os.environ["LOCAL_RANK"]),
                              int(local_size) if local_size else size)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    seen: list[torch.dtype] = []
    model.get_decoder().layers[0].self_attn.q_proj.register_forward_pre_hook(
        lambda mod, args: seen.append(mod.weight.dtype))
    mesh = distributed.device_mesh(world, "cpu")
    policy = distributed.apply_fsdp(PolicyLogProbs(model), mesh, param_dtype=torch.bfloat16)
    batch = fixed_batch(model.config.vocab_size)
    mine = torch.arange(len(batch.input_ids))[rank::size]
    logp, _ = policy(batch.rows(mine))
    loss = logp.sum()
    (loss * size).backward()
    grads = {n: p.grad.full_tensor() for n, p in policy.named_parameters()}
    total = loss.detach().clone()
    dist.all_reduce(total)
    result = {"loss": total, "grads": grads, "layer_dtype": seen[0],
              "grad_dtype": next(iter(grads.values())).dtype, "mesh": tuple(mesh.shape)}
    if local_size:
        before = {n: p.full_tensor().clone() for n, p in policy.named_parameters()}
        torch.optim.AdamW(policy.parameters(), lr=1e-3).step()
        result["moved"] = max(float((p.full_tensor() - before[n]).abs().max())
                              for n, p in policy.named_parameters())
    if rank == 0:
        torch.save(result, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
