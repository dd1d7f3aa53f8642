"""trainer.parallelize's levers leave the numbers those of the plain path: selective and full
activation checkpointing give the plain gradients (float64), selective recomputes no matmul,
and the regionally compiled layers give the eager log-probs and gradients."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM

from trainer.distributed import World
from trainer.logprobs import pack
from trainer.parallelize import checkpoint_kwargs, parallelize

CFG = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
           pad_token_id=0)


def _model(dtype=torch.float64):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**CFG)).to(dtype).train()


def _batch():
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 97, (n,), generator=g).tolist() for n in (5, 9, 3)]
    responses = [torch.randint(1, 97, (n,), generator=g).tolist() for n in (7, 2, 11)]
    return pack(prompts, responses, pad_id=0)


def _setup(model, ckpt: str | None = None, compile: bool = False):
    cfg = SimpleNamespace(gradient_checkpointing=ckpt is not None, checkpointing=ckpt or "full",
                          compile=compile)
    return parallelize(model, cfg, World(), "cpu", None, train=True)


def _run(policy, **kwargs):
    policy.zero_grad()
    lp, _ = policy(_batch(), **kwargs)
    lp.sum().backward()
    return lp.detach(), {n: p.grad.clone() for n, p in policy.named_parameters()}


class CountMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
                    torch.ops.aten.bmm.default):
            self.calls += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("ckpt", ["full", "selective"])
def test_checkpointing_gives_the_plain_gradients(ckpt):
    plain = _run(_setup(_model()))
    got = _run(_setup(_model(), ckpt))
    torch.testing.assert_close(got[0], plain[0], atol=1e-12, rtol=1e-12)
    for name, g in plain[1].items():
        torch.testing.assert_close(got[1][name], g, atol=1e-12, rtol=1e-10)


def test_selective_checkpointing_recomputes_no_matmul():
    """The backward's matmuls: full checkpointing re-runs each layer's forward ones,
    selective keeps their outputs and re-runs only the element-wise ops."""
    counts = {}
    for ckpt in (None, "full", "selective"):
        policy = _setup(_model(), ckpt)
        lp, _ = policy(_batch())
        with CountMatmuls() as mode:
            lp.sum().backward()
        counts[ckpt] = mode.calls
    assert counts["full"] > counts[None]
    assert counts["selective"] == counts[None]


class CountCompiledMatmuls(TorchDispatchMode):
    """Matmuls run under it, compiled ones included: the mode lets compiled code run inside
    it (ignore_compile_internals) and counts inductor's extern `mm.out` calls as well as
    the eager ops."""

    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls):
        return True

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # higher-order ops (the compiled recompute's rng wrapper) have no overload packet
        if getattr(func, "overloadpacket", None) in (torch.ops.aten.mm, torch.ops.aten.addmm,
                                                     torch.ops.aten.bmm):
            self.calls += 1
        return func(*args, **(kwargs or {}))


def test_compiled_selective_checkpointing_keeps_the_matmuls_it_keeps_eagerly():
    """Compiled layers with selective checkpointing: the backward runs no more matmuls than
    without checkpointing (their outputs are kept), full checkpointing re-runs them. The old
    order, transformers' checkpoint around the compiled layer, re-ran every matmul under
    "selective" too: the policy could not see into inductor's region (issue 46)."""
    torch._dynamo.reset()
    counts, grads = {}, {}
    for ckpt in (None, "full", "selective"):
        policy = _setup(_model(torch.float32), ckpt, compile=True)
        for _ in range(2):  # the second pass: compiled, no tracing in the count
            policy.zero_grad()
            lp, _ = policy(_batch())
            with CountCompiledMatmuls() as mode:
                lp.sum().backward()
        counts[ckpt] = mode.calls
        grads[ckpt] = {n: p.grad.clone() for n, p in policy.named_parameters()}
    assert counts["full"] > counts[None] > 0
    assert counts["selective"] == counts[None], counts
    for name, g in grads[None].items():
        torch.testing.assert_close(grads["selective"][name], g, atol=1e-5, rtol=1e-4)


def test_a_copy_of_a_checkpointed_model_computes_with_its_own_weights():
    """The checkpointed forward is bound to its layer: a deep copy (a test's or a tool's
    snapshot of the policy) runs the copy's weights, not the original's."""
    import copy

    policy = _setup(_model(), "selective")
    twin = copy.deepcopy(policy)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(0.5)
    lp, _ = policy(_batch())
    lp2, _ = twin(_batch())
    assert not torch.allclose(lp, lp2)
    lp.sum().backward()
    lp2.sum().backward()  # the copy recomputes through its own layers
    assert all(p.grad is not None for p in twin.parameters())


def test_an_unknown_checkpointing_mode_names_the_choices():
    with pytest.raises(ValueError, match=r"model.checkpointing='some'.*'full', 'selective'"):
        checkpoint_kwargs("some")


def test_compiled_layers_give_the_eager_numbers_under_the_same_names():
    eager = _setup(_model(torch.float32))
    names = [n for n, _ in eager.named_parameters()]
    compiled = _setup(_model(torch.float32), compile=True)
    assert [n for n, _ in compiled.named_parameters()] == names  # checkpoints, FSDP, optimizer
    want, got = _run(eager, padding_free=True), _run(compiled, padding_free=True)
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
    for name, g in want[1].items():
        torch.testing.assert_close(got[1][name], g, atol=1e-5, rtol=1e-4)


def test_selective_checkpointing_keeps_torchs_varlen_attention_output():
    """The varlen kernel's op is registered when trainer.attention is imported, before the
    policy's op set is first built (it is cached): on a GPU its output is kept, not redone."""
    from trainer.parallelize import _selective_ops

    assert torch.ops.torch_attn._varlen_attn.default in _selective_ops()
    assert torch.ops.aten.mm.default in _selective_ops()
