"""Collectives and FSDP2 generation at world size 2 (gloo), checked against the plain
torch calls they replace; rank 0 writes what it found to OUT (JSON).

    torchrun --nproc-per-node 2 tests/distributed/collectives_probe.py MODEL_DIR OUT
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

from trainer import distributed
from trainer.collection import Round, gather_rounds
from trainer.logprobs import PolicyLogProbs, pack


def rank_round(rank: int, with_logprobs: bool) -> Round:
    """A round whose sizes and values differ by rank (rank 1: one more response token)."""
    g = torch.Generator().manual_seed(rank)
    lengths = [3 + rank, 0, 5, 1 + 2 * rank]  # an empty response too
    token_ids = [torch.randint(0, 50_000, (t,), generator=g).tolist() for t in lengths]
    logprobs = ([(-torch.rand(t, generator=g, dtype=torch.float64) * 7).tolist()
                 for t in lengths] if with_logprobs else [None] * 4)
    return Round(prompt_ids=[[1, 2, 3 + rank], [4] * (rank + 1)], token_ids=token_ids,
                 rewards=[1.0, -1.0, 0.25 * rank - 0.5, -0.875], correct=[True, False] * 2,
                 truncated=[False, True, rank == 1, False], logprobs=logprobs)


def plain_gather(obj, size: int) -> list:
    out: list = [None] * size
    dist.all_gather_object(out, obj)
    return out


def not_sharded(model: torch.nn.Module) -> list[str]:
    """Names of FSDP modules holding any non-DTensor (i.e. unsharded) parameter."""
    return sorted(type(m).__name__ + ":" + name for name, m in model.named_modules()
                  if m in distributed.fsdp_modules(model)
                  and any(not isinstance(p, DTensor) for p in m.parameters(recurse=False)))


def main(model_dir: str, out: str) -> None:
    world = distributed.init("cpu")
    found: dict = {"device": str(distributed.collective_device(str(dist.get_backend()),
                                                               world.local_rank))}
    for with_lp in (True, False):
        mine = rank_round(world.rank, with_lp)
        found[f"rounds_equal_lp={with_lp}"] = (gather_rounds(mine, world)
                                               == plain_gather(mine, world.size))
    obj = {"rank": world.rank, "x": [0.1] * (world.rank + 2)}
    found["gather_equal"] = distributed.gather(obj, world) == plain_gather(obj, world.size)

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    policy = distributed.shard(PolicyLogProbs(model), world, "cpu")
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():  # the root's first forward sets FSDP2 up (as the trainer does)
        policy(pack([[5, 6]], [[7, 8]], pad_id=0))
        policy.reshard()
    found["sharded_before"] = not_sharded(policy)
    with distributed.unsharded(policy, world), torch.no_grad():
        found["sharded_inside"] = sorted(
            name for name, p in policy.named_parameters() if isinstance(p, DTensor))
        model.generate(ids, max_new_tokens=3 + 2 * world.rank, do_sample=False)
    found["unsharded_after"] = not_sharded(policy)
    found["fsdp_modules"] = len(distributed.fsdp_modules(policy))
    if world.main:
        with open(out, "w") as f:
            json.dump(found, f)
    distributed.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
