"""FSDP2 on CPU: per-rank memory of weights + AdamW state, and update throughput, world
size 2 vs 1, side by side in one run.

    python perf/fsdp_cpu.py                 # a 4-layer, hidden-256 model, 64 rows
    python perf/fsdp_cpu.py --hidden 512 --layers 8

Builds a random-init model (no warm start), then launches the same measurement with
`python -m trainer.launch` at world size 1 and 2 (gloo): one fixed global batch (the
tests' `fixed_batch`), a warm-up update, then `--updates` timed updates through
`Updater.update`. Bytes are this rank's local shards of parameters and optimizer states.
On a 2-core machine the two ranks share the cores, so the throughput ratio measures
overhead more than speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]


def local_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total


def measure(config: str, out: str, updates: int) -> None:
    """Runs on every rank (under torchrun); rank 0 writes the JSON."""
    sys.path.insert(0, str(REPO / "tests" / "distributed"))
    from dist_update_script import fixed_batch

    from algorithms import compute_advantages
    from trainer import distributed
    from trainer.config import load_run_config
    from trainer.loop import Trainer

    trainer = Trainer(load_run_config(config))
    trainer.setup(track=False)
    trainer.global_step = 1
    batch, rewards, groups = fixed_batch(trainer.model.config.vocab_size, 64, 8, trainer.device)
    old, _ = trainer.updater.logprobs_no_grad(trainer.policy, batch, with_entropy=False)
    adv = compute_advantages(rewards, groups, "group_mean", mask=batch.response_mask)
    trainer.updater.update(batch, old, None, adv)  # warm-up: allocates the AdamW states
    start = time.perf_counter()
    for _ in range(updates):
        trainer.updater.update(batch, old, None, adv)
    seconds = time.perf_counter() - start
    params = local_bytes(trainer.optimizer.param_groups[0]["params"])
    states = local_bytes(v for s in trainer.optimizer.state.values() for v in s.values()
                         if torch.is_tensor(v) and v.dim() > 0)
    per_rank = distributed.gather({"params": params, "optimizer": states}, trainer.world)
    if trainer.world.main:
        tokens = int(batch.response_mask.sum()) * updates
        Path(out).write_text(json.dumps({"per_rank": per_rank, "tokens_per_s": tokens / seconds}))
    distributed.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--updates", type=int, default=5)
    ap.add_argument("--measure", nargs=2, metavar=("CONFIG", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        return measure(*args.measure, args.updates)
    from trainer.tiny import TinyConfig, build_tiny

    tmp = Path(tempfile.mkdtemp(prefix="fsdp-bench-"))
    model = build_tiny(tmp / "model", TinyConfig(hidden_size=args.hidden,
                                                 intermediate_size=3 * args.hidden,
                                                 num_layers=args.layers, num_heads=4,
                                                 sft_steps=0), progress=False)
    cfg = {"run_id": "bench", "out_dir": str(tmp / "run"), "model": {"path": str(model),
           "device": "cpu"}, "rollout": {"n": 8, "prompts_per_step": 8},
           "optim": {"micro_batch_size": 16}, "tracking": {"mlflow_uri": None}}
    (tmp / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    results = {}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for world in (1, 2):
        out = tmp / f"ws{world}.json"
        cmd = [sys.executable, "-m", "trainer.launch", "--standalone", "--nproc-per-node",
               str(world), __file__, "--updates", str(args.updates), "--measure",
               str(tmp / "cfg.yaml"), str(out)]
        subprocess.run(cmd, check=True, env=env, cwd=REPO, capture_output=True)
        results[world] = json.loads(out.read_text())
    one, two = results[1], results[2]
    print(f"model: hidden {args.hidden}, {args.layers} layers; 64 rows; {args.updates} updates")
    print(f"{'per-rank bytes (rank 0)':<34}{'ws=1':>12}{'ws=2':>12}{'ratio':>8}")
    for key in ("params", "optimizer"):
        a, b = one["per_rank"][0][key], two["per_rank"][0][key]
        print(f"{key:<34}{a:>12,}{b:>12,}{b / a:>8.3f}")
    a, b = one["tokens_per_s"], two["tokens_per_s"]
    print(f"{'update throughput (tokens/s)':<34}{a:>12.0f}{b:>12.0f}{b / a:>8.3f}")


if __name__ == "__main__":
    main()
