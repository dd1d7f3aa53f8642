"""The prepared GPU check: the trainer's update path on a locally built ~1B model.

    python perf/gpu_smoke.py                       # 1 GPU, ~1.1B parameters, ~3-5 min
    python perf/gpu_smoke.py --gpus 8              # FSDP2 over 8 GPUs of one node
    python perf/gpu_smoke.py --cpu --tiny          # the same path on CPU (gloo), seconds

No network, no vLLM, no tokenizer: torchrun starts `--gpus` ranks (NCCL on GPU, gloo on
CPU); each builds the same random-init Llama (Qwen3-1.7B-like widths, 151,936 vocab),
measures float32 log-probs of a probe batch unsharded, then shards it with
`trainer.distributed.shard` (FSDP2, bf16 MixedPrecisionPolicy, float32 reduce), and runs
`--steps` updates of a token-budget micro-batch of skewed-length rows through
`PolicyLogProbs` (padding-free, FlashAttention-2 varlen on GPU, sdpa on CPU; chunked head
log-probs), AdamW included. Prints tokens/s, model FLOPs utilisation of the update against
the device's dense bf16 peak (FLOPs counted as sweep.sizing counts them), peak memory per
rank and the bf16-vs-float32 log-prob gap on the probe batch.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

# Dense bf16 peak TFLOPS by device name (sweep.sizing's GPUS, by the name CUDA reports).
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}
SIZES = {  # LlamaConfig fields
    "1b": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 16,
           "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
           "vocab_size": 151_936},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "vocab_size": 1000},
}


def _rows(vocab: int, budget: int, max_len: int, seed: int):
    """Prompt/response token lists whose lengths are log-normal, up to `budget` tokens."""
    gen = torch.Generator().manual_seed(seed)
    prompts, responses, total = [], [], 0
    while True:
        p = int(torch.randint(8, 64, (1,), generator=gen))
        r = int(torch.exp(torch.randn(1, generator=gen) * 0.8).item() * max_len / 4) + 1
        r = min(r, max_len)
        if total + p + r > budget and prompts:
            return prompts, responses
        prompts.append(torch.randint(4, vocab, (p,), generator=gen).tolist())
        responses.append(torch.randint(4, vocab, (r,), generator=gen).tolist())
        total += p + r


def update_flops(n_params: int, cfg, tokens: int, context: float) -> float:
    """FLOPs of one update (forward + backward: 3 forwards, no recompute) as sweep.sizing:
    2P + causal attention per token per forward, plus the chunked head's recompute."""
    attention = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * context
    return tokens * (3 * (2 * n_params + attention) + 2 * cfg.vocab_size * cfg.hidden_size)


def worker(args) -> None:
    """One rank: build, probe, shard, update; rank 0 writes the report as JSON."""
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer import distributed
    from trainer.logprobs import PolicyLogProbs, balanced_share, pack

    device_type = "cpu" if args.cpu else "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
    # a group even at one rank, so FSDP2 and its mixed-precision policy run there too
    dist.init_process_group("gloo" if args.cpu else "nccl")
    world = distributed.World(dist.get_rank(), dist.get_world_size(), local_rank,
                              int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size())))
    device = torch.device(device_type, local_rank) if not args.cpu else torch.device("cpu")
    attn = "sdpa" if args.cpu else "flash_attention_2"
    cfg = LlamaConfig(**SIZES["tiny" if args.tiny else "1b"], max_position_embeddings=8192,
                      tie_word_embeddings=False, attn_implementation=attn)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)  # float32 master weights, identical on every rank
    n_params = sum(p.numel() for p in model.parameters())
    if not args.tiny:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    bf16 = torch.bfloat16

    probe = pack(*_rows(cfg.vocab_size, 2048 if not args.tiny else 256, 512, seed=99),
                 pad_id=0).to(device)
    model.config._attn_implementation = "sdpa"  # FlashAttention-2 has no float32 kernel
    with torch.no_grad():
        fp32_logp, _ = PolicyLogProbs(model)(probe)  # padded, float32, unsharded
    model.config._attn_implementation = attn
    policy = distributed.apply_fsdp(PolicyLogProbs(model), distributed.device_mesh(
        world, device_type), param_dtype=bf16)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    with torch.no_grad():
        bf16_logp, _ = policy(probe, autocast=bf16, padding_free=True)
    mask = probe.response_mask.bool()
    gap = (bf16_logp - fp32_logp)[mask].abs()

    # every rank holds the whole batch and trains its token-balanced share (trainer.loop)
    batch = pack(*_rows(cfg.vocab_size, args.tokens * world.size, args.max_len, seed=1),
                 pad_id=0).to(device)
    mine = balanced_share(batch, torch.arange(len(batch.input_ids), device=device),
                          world.rank, world.size)
    mb = batch.rows(mine)
    tokens = int(mb.attention_mask.sum())
    context = float((mb.attention_mask.sum(-1) ** 2).sum() / 2 / tokens)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(args.steps + 1):  # the first step warms up (FSDP2 lazy init, kernels)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        logp, _ = policy(mb, autocast=bf16, padding_free=True)
        loss = -(logp * mb.response_mask).sum() / mb.response_mask.sum()
        (loss * world.size).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step:
            times.append(time.perf_counter() - start)
    seconds = sum(times) / len(times)
    if device.type == "cuda":
        peak_gib = torch.cuda.max_memory_allocated() / 2**30
        name = torch.cuda.get_device_name()
    else:
        peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
        name = "cpu"
    flops = update_flops(n_params, cfg, tokens, context)
    mine_report = {"tokens": tokens, "seconds": seconds, "flops": flops, "peak_gib": peak_gib}
    reports = [None] * world.size
    dist.all_gather_object(reports, mine_report)
    if world.main:
        peak = next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
        slowest = max(r["seconds"] for r in reports)
        total_flops = sum(r["flops"] for r in reports)
        report = {
            "device": name, "ranks": world.size, "params": n_params, "attention": attn,
            "tokens_per_s": sum(r["tokens"] for r in reports) / slowest,
            "mfu": (total_flops / slowest / (world.size * peak * 1e12)) if peak else None,
            "step_s": slowest, "peak_gib_per_rank": [r["peak_gib"] for r in reports],
            "logp_gap_mean": float(gap.mean()), "logp_gap_max": float(gap.max()),
            "loss": float(loss.detach()),
        }
        Path(args.out).write_text(json.dumps(report))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=1, help="ranks (GPUs; CPU processes with --cpu)")
    p.add_argument("--cpu", action="store_true", help="gloo on CPU, sdpa (no GPU needed)")
    p.add_argument("--tiny", action="store_true", help="a ~0.2M-parameter model (with --cpu)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--tokens", type=int, default=32768, help="token budget per rank and step")
    p.add_argument("--max-len", type=int, default=8192, help="longest response")
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if not args.cpu and not torch.cuda.is_available():
        sys.exit("gpu_smoke: no CUDA device; run with --cpu --tiny for the CPU path")
    if not args.cpu:
        from trainer.loop import check_attention

        check_attention("flash_attention_2")
    out = Path(args.out or f"/tmp/gpu_smoke_{os.getpid()}.json")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(args.gpus), __file__, "--worker", "--out", str(out), "--steps", str(args.steps),
           "--tokens", str(args.tokens), "--max-len", str(args.max_len)]
    cmd += ["--cpu"] * args.cpu + ["--tiny"] * args.tiny
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(Path(__file__)
                                                                         .resolve().parents[1])})
    r = json.loads(out.read_text())
    mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a (no bf16 peak for device)"
    print(f"gpu_smoke: {r['params'] / 1e6:.1f}M parameters, {r['ranks']} rank(s) on "
          f"{r['device']}, FSDP2 bf16 policy, padding-free {r['attention']}")
    print(f"tokens/s: {r['tokens_per_s']:.0f} (update step {r['step_s']:.3f} s)")
    print(f"MFU: {mfu}")
    print("peak memory per rank (GiB): " + ", ".join(f"{m:.2f}" for m in r["peak_gib_per_rank"]))
    print(f"bf16-vs-fp32 log-prob gap: mean {r['logp_gap_mean']:.2e}, max {r['logp_gap_max']:.2e}")


if __name__ == "__main__":
    main()
