"""Set-up of one run's models: the policy and its tokenizer, LoRA adapters, the reference, the
lagged generation copy, and every log-prob module made ready to compute.

    models = build_models(cfg, world, device, autocast)
    models.policy          # PolicyLogProbs of the trained model (checkpointed, compiled, FSDP2)
    models.ref_policy      # the reference's log-prob module, or None (schedule "rollout")
    models.behaviour_policy  # what recomputes pi_old: the policy, or the lag's copy

The held copies are made from the initial weights before any resume state is loaded (a
"fixed" reference is the initial policy; under rollout.staleness the lag starts there too);
`trainer.parallelize` then sets each module up in one order (attention, checkpointing,
compilation, FSDP2), and under FSDP2 rank 0's weights reach the other ranks as shards.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainer import distributed, lora
from trainer.config import RunConfig
from trainer.logprobs import PolicyLogProbs, pack
from trainer.parallelize import check_attention, parallelize
from trainer.reference import Reference
from trainer.runtime import torch_dtype
from trainer.staleness import WeightLag


def load_device(world, device: torch.device) -> torch.device:
    """Where `load_policy` puts the weights: the CPU when they will be sharded (FSDP2 moves
    each rank's shards to its device), else the run's device."""
    return torch.device("cpu") if world.distributed else device


def reference_dtype(name: str, autocast: torch.dtype | None) -> torch.dtype | None:
    """model.reference_dtype as a dtype; auto: bf16 when computing in bf16, else as stored."""
    if name == "auto":
        return torch.bfloat16 if autocast == torch.bfloat16 else None
    return torch_dtype(name)


def load_policy(model_cfg, device: torch.device, empty: bool = False):
    """Model (train mode, `dtype` weights, `attn_implementation`) and tokenizer (pad token
    guaranteed), as stored: `trainer.parallelize` sets it up to compute. `empty`:
    parameters on the meta device, the weights file unread (distributed ranks but 0)."""
    if not model_cfg.path:
        raise ValueError("model.path is required (an HF model directory or hub id; for the "
                         "tiny default build one with `python -m trainer tiny --out DIR`)")
    # Never the model repository's own code: checkpoints are data (docs/security.md).
    tokenizer = AutoTokenizer.from_pretrained(model_cfg.path, trust_remote_code=False)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    check_attention(model_cfg.attn_implementation, device.type)
    kwargs = {"dtype": torch_dtype(model_cfg.dtype), "trust_remote_code": False}
    if model_cfg.attn_implementation:
        kwargs["attn_implementation"] = model_cfg.attn_implementation
    model = (distributed.empty_model(model_cfg.path, **kwargs) if empty else
             AutoModelForCausalLM.from_pretrained(model_cfg.path, **kwargs).to(device))
    model.train()
    return model, tokenizer


def check_world_size(cfg: RunConfig, world) -> None:
    """Each rank generates an equal share of a round's prompts."""
    for key in ("prompts_per_step", "gen_prompts_per_round"):
        value = getattr(cfg.rollout, key)
        if value is not None and value % world.size:
            raise ValueError(f"rollout.{key}={value} must be a multiple of the world size "
                             f"{world.size} (each rank generates an equal share)")


@dataclass
class Models:
    """Everything a run computes with. `model` is the HF model (adapted in place under
    LoRA; `peft` its wrapper, for saving the adapters); the three log-prob modules may be
    one and the same."""

    model: torch.nn.Module
    tokenizer: object
    peft: object | None
    policy: torch.nn.Module
    ref_policy: torch.nn.Module | None
    behaviour_policy: torch.nn.Module
    ref_schedule: Reference
    lag: WeightLag | None

    @property
    def sampling_model(self):
        """The model whose weights the rollouts sample from: the trained one, or the lag's."""
        return self.model if self.lag is None else self.lag.model


def build_models(cfg: RunConfig, world, device: torch.device,
                 autocast: torch.dtype | None) -> Models:
    """Load the policy (rank 0 alone reads the weights, on the CPU, when distributed: they
    reach each GPU only as FSDP2 shards, never as a full fp32 copy per GPU), adapt it, make
    the held copies and set every log-prob module up to compute (see module doc)."""
    model, tokenizer = load_policy(cfg.model, load_device(world, device),
                                   empty=world.distributed and not world.main)
    # LoRA: adapters injected in place (model stays the HF model); peft saves them
    peft = lora.apply_lora(model, cfg.model.lora) if cfg.model.lora else None
    check_world_size(cfg, world)
    # method.reference (a ReferenceConfig) holds the schedule's knobs; the resolved method's
    # `reference` is the schedule's name (the method's default or the override).
    ref_settings, m = cfg.method.reference, cfg.model
    ref_schedule = Reference(cfg.resolved_method().reference, model,
                             dtype=reference_dtype(m.reference_dtype, autocast),
                             empty=world.distributed, adapters=peft is not None,
                             **ref_settings.model_dump(exclude={"schedule"}))
    k = cfg.rollout.staleness
    # Stale rollouts (trainer.staleness): a generation copy of the initial weights that
    # samples and recomputes the behaviour log-probs (under FSDP2 sharded, filled from
    # rank 0 like the reference); none (and no copy) at k = 0.
    lag = WeightLag(model, k, empty=world.distributed) if k else None
    full = distributed.full_state_on_rank0(PolicyLogProbs(model), world)
    setup = functools.partial(parallelize, model_cfg=m, world=world, device_type=device.type,
                              compute_dtype=autocast)
    policy = setup(model, train=True)
    # the reference's log-prob module: its held copy, or (LoRA) the policy's own
    copy = ref_schedule.model
    ref_policy = (setup(copy, train=False, offload=m.reference_offload) if copy is not None
                  else policy if ref_schedule.held else None)
    behaviour_policy = policy if lag is None else setup(lag.model, train=False)
    if world.distributed:
        roots = [policy] + ([ref_policy] if copy is not None else [])
        distributed.load_from_rank0(policy, full, world, device)
        if copy is not None:
            distributed.load_from_rank0(ref_policy, full, world, device,
                                        offload=m.reference_offload)
        if lag is not None:
            distributed.load_from_rank0(behaviour_policy, full, world, device)
            roots.append(behaviour_policy)
        del full
        # FSDP2 sets itself up at the root's first forward; generation calls the inner
        # model's layers directly, so run one root forward before any of that.
        token = [tokenizer.pad_token_id]
        probe = pack([token], [token], tokenizer.pad_token_id).to(device)
        with torch.no_grad():
            for module in roots:
                module(probe)
                module.reshard()  # so parameters() below are the sharded ones
    return Models(model, tokenizer, peft, policy, ref_policy, behaviour_policy, ref_schedule,
                  lag)
