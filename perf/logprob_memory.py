"""Peak memory of token log-probs + entropy: chunked (trainer) vs naive full log-softmax.

    python perf/logprob_memory.py                  # vocab 32k, 1024 tokens, CPU
    python perf/logprob_memory.py --device cuda --tokens 4096 --vocab 151936

Both paths start from the same final hidden states (N = tokens, H) and LM-head weight
(V, H) and produce log-probs and entropies with gradients to the hidden states; the
naive path materialises the float32 [N, V] logits and log-softmax, the trainer path
(`trainer.logprobs.head_logprobs`) works in checkpointed chunks. Peak memory is measured
above the inputs: on CUDA with torch.cuda.max_memory_allocated, on CPU by counting live
tensor storages through a TorchDispatchMode (BLAS packing buffers, which are not tensors,
are not counted on either path).
"""

from __future__ import annotations

import argparse
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from trainer.logprobs import auto_chunk_tokens, head_logprobs


def naive(hidden, weight, targets):
    logits = (hidden @ weight.T).float()  # (N, V)
    logp_all = torch.log_softmax(logits, dim=-1)  # (N, V)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def chunked(hidden, weight, targets, chunk):
    return head_logprobs(hidden, weight, targets, chunk_tokens=chunk, with_entropy=True)


class LiveTensorBytes(TorchDispatchMode):
    """Counts bytes of live tensor storages (allocator-independent) and records the peak.

    Every op output's storage is counted once until its last tensor is freed (PyTorch keeps
    a tensor's Python object alive while autograd still holds it, so finalizers fire when
    the memory is really released).
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self._refs: dict[int, list[int]] = {}

    def _release(self, key: int) -> None:
        entry = self._refs[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self._refs[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key == 0:
                    continue
                if key not in self._refs:
                    self._refs[key] = [0, storage.nbytes()]
                    self.live += storage.nbytes()
                    self.peak = max(self.peak, self.live)
                self._refs[key][0] += 1
                weakref.finalize(t, self._release, key)
        return out


def peak_bytes(fn, device) -> int:
    """Peak bytes allocated above the inputs while running fn() (forward + backward)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    with LiveTensorBytes() as counter:
        fn()
    return counter.peak


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=32_000)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--chunk", type=int, default=None, help="rows per chunk (default: the "
                   "trainer's auto_chunk_tokens(vocab))")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = p.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    args.chunk = args.chunk or auto_chunk_tokens(args.vocab)
    torch.manual_seed(0)
    hidden = torch.randn(args.tokens, args.hidden, device=device, dtype=dtype, requires_grad=True)
    # In place: a temporary as large as the weight would raise the CPU baseline peak.
    weight = torch.randn(args.vocab, args.hidden, device=device, dtype=dtype).mul_(0.02)
    targets = torch.randint(0, args.vocab, (args.tokens,), device=device)

    def run(fn):
        def go():
            hidden.grad = None
            logp, ent = fn()
            (logp.sum() + ent.sum()).backward()
        return go

    paths = {"naive": lambda: naive(hidden, weight, targets),
             "chunked": lambda: chunked(hidden, weight, targets, args.chunk)}
    # Same numbers first (the benchmark compares equal work).
    a, b = paths["naive"](), paths["chunked"]()
    torch.testing.assert_close(a[0], b[0], atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(a[1], b[1], atol=1e-3, rtol=1e-3)
    del a, b
    peaks = {name: peak_bytes(run(fn), device) for name, fn in paths.items()}
    naive_peak, chunk_peak = peaks["naive"], peaks["chunked"]
    mib = 2**20
    print(f"log-prob + entropy, forward+backward, vocab {args.vocab}, {args.tokens} tokens, "
          f"hidden {args.hidden}, {args.dtype}, {device}")
    print(f"  naive full log-softmax : {naive_peak / mib:9.1f} MiB peak")
    print(f"  chunked ({args.chunk:>5} tokens) : {chunk_peak / mib:9.1f} MiB peak")
    print(f"  ratio naive / chunked  : {naive_peak / max(chunk_peak, 1):9.1f}x  (target >= 4x)")


if __name__ == "__main__":
    main()
