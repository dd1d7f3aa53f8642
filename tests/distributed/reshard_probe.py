"""Run by test_unsharded_keeps_fsdp2_defaults: FSDP2 at world size 1 (gloo), the root's and
a layer's reshard-after-forward setting after the first forward, after
`trainer.distributed.unsharded` and after one that raised inside. Prints one JSON line."""

from __future__ import annotations

import json
import socket

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

from trainer import distributed


def reshards(module) -> bool:
    """Whether `module` frees its gathered parameters after a forward (FSDP2's private
    state: a post-forward mesh means it reshards)."""
    groups = module._get_fsdp_state()._fsdp_param_groups
    return all(g.post_forward_mesh_info is not None for g in groups)


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2))
    distributed.apply_fsdp(model, distributed.device_mesh(distributed.World(), "cpu"))
    world = distributed.World(rank=0, size=2)  # "distributed", so unsharded acts
    ids = torch.randint(1, 97, (1, 5))
    layer = model.model.layers[0]
    out = {}
    model(input_ids=ids)
    out["first"] = [reshards(model), reshards(layer)]
    with distributed.unsharded(model, world):
        model(input_ids=ids)
        out["inside"] = [reshards(model), reshards(layer)]
    model(input_ids=ids)
    out["after"] = [reshards(model), reshards(layer)]
    try:
        with distributed.unsharded(model, world):
            raise RuntimeError("generation failed")
    except RuntimeError:
        pass
    out["after_error"] = [reshards(model), reshards(layer)]
    print(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
