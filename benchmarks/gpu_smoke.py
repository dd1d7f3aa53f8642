"""GPU smoke test: build the tiny model, run 5 trainer steps in bf16 on CUDA (hf engine).

    python benchmarks/gpu_smoke.py                  # needs a CUDA GPU
    python benchmarks/gpu_smoke.py --steps 5 --prompts 32 --n 8

Prints per-step tokens/s (generated response tokens per second of step time) and the
peak GPU memory. Weights stay float32 (AdamW master weights); forward passes autocast to
bfloat16, as in a real run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from trainer.config import parse_run_config
from trainer.loop import train
from trainer.tiny import TinyConfig, build_tiny


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--sft-steps", type=int, default=100)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("gpu_smoke: no CUDA device; nothing to do", file=sys.stderr)
        sys.exit(0)
    work = Path(tempfile.mkdtemp(prefix="gpu_smoke_"))
    model = build_tiny(work / "tiny", TinyConfig(sft_steps=args.sft_steps), progress=False)
    cfg = parse_run_config({
        "run_id": "gpu-smoke", "out_dir": str(work / "run"),
        "model": {"path": str(model), "device": "cuda", "compute_dtype": "bfloat16"},
        "rollout": {"n": args.n, "prompts_per_step": args.prompts},
        "optim": {"steps": args.steps}, "tracking": {"mlflow_uri": None},
    })
    torch.cuda.reset_peak_memory_stats()
    out = train(cfg)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        print(f"step {r['step']}: {r['tokens_per_sec']:.0f} tokens/s, acc {r['acc_mean']:.3f}, "
              f"rollout {r['time_rollout']:.2f}s, update {r['time_update']:.2f}s")
    print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB "
          f"({torch.cuda.get_device_name()})")


if __name__ == "__main__":
    main()
