"""Set-up memory decisions: weights load on the CPU when they will be sharded, a held
reference is stored in bf16 when the run computes in bf16 (it has no optimizer state and
needs no float32 master), and it can be CPU-offloaded under FSDP2."""

from __future__ import annotations

import torch

from trainer import distributed
from trainer.distributed import World
from trainer.logprobs import PolicyLogProbs
from trainer.loop import Trainer
from trainer.setup import load_device, reference_dtype


def test_weights_load_on_the_cpu_when_sharded():
    cuda = torch.device("cuda", 1)
    assert load_device(World(1, 2, 1, 2), cuda) == torch.device("cpu")
    assert load_device(World(), cuda) == cuda


def test_reference_dtype_follows_the_compute_dtype():
    assert reference_dtype("auto", torch.bfloat16) == torch.bfloat16  # GPU default
    assert reference_dtype("auto", None) is None  # CPU default: as stored (float32)
    assert reference_dtype("float32", torch.bfloat16) == torch.float32
    assert reference_dtype("bfloat16", None) == torch.bfloat16


def test_held_reference_is_bf16_and_its_refresh_casts(make_cfg):
    t = Trainer(make_cfg("ref16", method={"name": "GRPO"}, model={"reference_dtype": "bfloat16"}))
    t.setup(track=False)
    assert t.ref_schedule.held
    assert {p.dtype for p in t.ref_schedule.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in t.model.parameters()} == {torch.float32}
    with torch.no_grad():
        next(t.model.parameters()).add_(1.0)
    t.ref_schedule.refresh(t.model)
    ref_w, pol_w = next(t.ref_schedule.model.parameters()), next(t.model.parameters())
    assert ref_w.dtype == torch.bfloat16
    torch.testing.assert_close(ref_w, pol_w.to(torch.bfloat16))


def test_reference_offload_reaches_fully_shard(tiny_dir, monkeypatch):
    """The offload policy FSDP2 gets per module (recorded: CPUOffloadPolicy needs CUDA)."""
    from torch.distributed import fsdp
    from transformers import AutoModelForCausalLM

    calls = []
    monkeypatch.setattr(fsdp, "fully_shard", lambda m, **kw: calls.append(kw) or m)
    model = PolicyLogProbs(AutoModelForCausalLM.from_pretrained(tiny_dir))
    for offload in (True, False):
        calls.clear()
        distributed.apply_fsdp(model, mesh="mesh", param_dtype=torch.bfloat16, offload=offload)
        assert len(calls) == model.model.config.num_hidden_layers + 1
        kinds = {type(c["offload_policy"]) for c in calls}
        assert kinds == ({fsdp.CPUOffloadPolicy} if offload else {fsdp.OffloadPolicy})
        assert [c["mp_policy"].param_dtype for c in calls] == [torch.bfloat16] * (
            len(calls) - 1) + [None]  # the root keeps float32 (the chunked head)
        assert {c["mp_policy"].reduce_dtype for c in calls} == {torch.float32}
