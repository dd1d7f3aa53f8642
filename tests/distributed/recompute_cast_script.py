"""FSDP2 + activation checkpointing under bf16, with FSDP2's recompute as torch < 2.13 runs it.

    torchrun --nproc-per-node N tests/distributed/recompute_cast_script.py MODEL OUT MODE CKPT

MODE `fixed`: the trainer's set-up (`trainer.parallelize`: its checkpoint sits inside FSDP2's
hooks, and its FSDP2 layers get their inputs already in bf16); `hooks-outside`: the same with
`layer_inputs_in` switched off (the checkpoint's placement alone); `unfixed`: the code before
both fixes (transformers' checkpointing, whose checkpoint runs FSDP2's hooks inside it, and no
`layer_inputs_in`). Either way FSDP2's pre-forward hook is patched to skip its input cast while
recomputing (the behaviour before pytorch#182580, torch 2.13), so this torch runs what the
device image's 2.11 runs. CKPT: full or selective. Rank 0 saves the loss and gradients of
one forward/backward under bf16 autocast, or the error it raised.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard import _fsdp_state
from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState
from transformers import AutoModelForCausalLM

from trainer import distributed
from trainer.parallelize import parallelize

# torch 2.13 casts in a method the recompute also calls; before it the cast sat inline in
# `_pre_forward` after the recompute's early return (nothing to emulate there).
_cast = getattr(_fsdp_state.FSDPState, "_cast_forward_inputs", None)


def _cast_before_2_13(self, args, kwargs):
    """FSDP2's input cast as before torch 2.13: skipped in the checkpoint's recompute."""
    if self._training_state == TrainingState.PRE_BACKWARD:
        return args, kwargs
    return _cast(self, args, kwargs)


def main(model_dir: str, out: str, mode: str, ckpt: str) -> None:
    if _cast is not None:
        _fsdp_state.FSDPState._cast_forward_inputs = _cast_before_2_13
    if mode in ("unfixed", "hooks-outside"):
        distributed.layer_inputs_in = lambda model, dtype: None
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    world = distributed.World(rank, size, int(os.environ["LOCAL_RANK"]), size)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    cfg = SimpleNamespace(gradient_checkpointing=mode != "unfixed", checkpointing=ckpt,
                          compile=False)
    if mode == "unfixed":
        model.gradient_checkpointing_enable({"use_reentrant": False})
    policy = parallelize(model, cfg, world, "cpu", torch.bfloat16, train=True)
    from mp_policy_script import fixed_batch

    batch = fixed_batch(model.config.vocab_size)
    mine = torch.arange(len(batch.input_ids))[rank::size]
    result: dict = {}
    try:
        logp, _ = policy(batch.rows(mine), autocast=torch.bfloat16)
        (logp.sum() * size).backward()
        result["grads"] = {n: p.grad.full_tensor() for n, p in policy.named_parameters()}
    except torch.utils.checkpoint.CheckpointError as e:
        result["error"] = str(e).splitlines()[0]
    if rank == 0:
        torch.save(result, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
