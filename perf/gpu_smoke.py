"""GPU smoke test: trainer steps in bf16 on CUDA with FSDP2, tokens/s and peak memory.

    python perf/gpu_smoke.py                          # tiny model, 1 GPU
    python perf/gpu_smoke.py --size 0.5b              # ~0.5B-parameter Llama
    python perf/gpu_smoke.py --size 0.5b --gpus 2     # FSDP2 over 2 GPUs

Builds the model locally (the tiny task's tokenizer; `--size 0.5b` is hidden 1280 x 24
layers, random init, no warm start), then runs `--steps` trainer steps through
`python -m trainer.launch` (torchrun) at `--gpus` processes: float32 sharded master
weights and AdamW states, bfloat16 autocast, gradient checkpointing for 0.5b, hf engine.
Prints per-step tokens/s (generated response tokens per second of step time) and every
rank's peak GPU memory. Exits 0 with a note where no GPU is present.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

SIZES = {  # TinyConfig fields
    "tiny": {"sft_steps": 100},
    "0.5b": {"hidden_size": 1280, "intermediate_size": 3456, "num_layers": 24,
             "num_heads": 20, "sft_steps": 0},
}


def worker(config: str, out: str) -> None:
    """One rank (under torchrun): train, then report this rank's peak memory."""
    from trainer import distributed
    from trainer.config import load_run_config
    from trainer.loop import train

    torch.cuda.reset_peak_memory_stats()
    cfg = load_run_config(config)
    train(cfg)
    world = distributed.init("cuda")
    peaks = distributed.gather(torch.cuda.max_memory_allocated() / 2**30, world)
    if world.main:
        Path(out).write_text(json.dumps(peaks))
    distributed.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--size", choices=sorted(SIZES), default="tiny")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--worker", nargs=2, metavar=("CONFIG", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(*args.worker)
    if not torch.cuda.is_available():
        print("gpu_smoke: no CUDA device; nothing to do", file=sys.stderr)
        sys.exit(0)
    from trainer.tiny import TinyConfig, build_tiny

    work = Path(tempfile.mkdtemp(prefix="gpu_smoke_"))
    model = build_tiny(work / "model", TinyConfig(**SIZES[args.size]), progress=False)
    n_params = sum(v.numel() for v in load_file(model / "model.safetensors").values())
    cfg = {
        "run_id": "gpu-smoke", "out_dir": str(work / "run"),
        "model": {"path": str(model), "device": "cuda", "compute_dtype": "bfloat16",
                  "gradient_checkpointing": args.size != "tiny"},
        "rollout": {"n": args.n, "prompts_per_step": args.prompts, "dynamic_sampling": False},
        "optim": {"steps": args.steps, "mini_batch_size": args.n * args.prompts // 4,
                  "max_tokens_per_micro_batch": 16384},
        "tracking": {"mlflow_uri": None, "progress": False},
    }
    (work / "run.yaml").write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "trainer.launch", "--standalone", "--nproc-per-node",
           str(args.gpus), __file__, "--worker", str(work / "run.yaml"), str(work / "peaks.json")]
    subprocess.run(cmd, check=True, env=os.environ)
    rows = [json.loads(x) for x in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    print(f"{args.size}: {n_params / 1e6:.0f}M parameters, {args.gpus} GPU(s) "
          f"({torch.cuda.get_device_name()}), {args.prompts} x {args.n} rollouts per step")
    for r in rows:
        print(f"step {r['step']}: {r['tokens_per_sec']:.0f} tokens/s, rollout "
              f"{r['time_rollout']:.2f}s, update {r['time_update']:.2f}s")
    peaks = json.loads((work / "peaks.json").read_text())
    print("peak GPU memory per rank (GiB): " + ", ".join(f"{m:.2f}" for m in peaks))


if __name__ == "__main__":
    main()
