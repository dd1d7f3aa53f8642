"""Step time of this trainer vs TRL's GRPOTrainer on the same tiny model, batch and length.

    /work/venv/bin/pip install trl           # benchmark-only dependency
    python perf/trl_step_time.py --model DIR [--steps 10]

Both run GRPO (group z-score advantages, clip 0.2, beta as configured) for `--steps` steps
with 8 prompts x 8 samples, 32 new tokens, on the CPU; the script prints mean seconds per
step for each and the ratio ours / TRL (target <= 1.0). Skips with a message when trl is
not installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path


def ours(model: str, steps: int, out: Path) -> float:
    from trainer.config import parse_run_config
    from trainer.loop import Trainer
    from trainer.runtime import tune_cpu_runtime

    tune_cpu_runtime()
    cfg = parse_run_config({
        "run_id": "ours", "out_dir": str(out), "model": {"path": model, "device": "cpu"},
        "method": {"name": "GRPO"}, "optim": {"steps": steps},
        "rollout": {"n": 8, "prompts_per_step": 8, "max_new_tokens": 32},
        "tracking": {"mlflow_uri": None, "progress": False},
    })
    trainer = Trainer(cfg)
    trainer.setup(track=False)
    trainer.step()  # warm-up
    t0 = time.perf_counter()
    for _ in range(steps):
        trainer.step()
    return (time.perf_counter() - t0) / steps


def trl(model: str, steps: int, out: Path) -> float:
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from common import toy
    from common.grading import grade_many
    from common.prompts import build_prompt

    tok = AutoTokenizer.from_pretrained(model)
    problems = toy.problems("train", 8 * (steps + 1), seed=0)
    ds = Dataset.from_list([{"prompt": build_prompt(p["problem"], "dapo", tok),
                             "answer": p["answer"]} for p in problems])

    def reward(completions, answer, **_):
        return [1.0 if r.correct else -1.0 for r in grade_many(completions, answer, "dapo")]

    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t0)

    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=64, num_generations=8,
                      max_completion_length=32, max_steps=steps + 1, learning_rate=2e-4,
                      beta=1e-4, logging_steps=1000, save_strategy="no", report_to=[],
                      use_cpu=True, seed=0, gradient_checkpointing=False)  # ours does not
    GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds,
                processing_class=tok, callbacks=[Timer()]).train()
    return sum(times[1:]) / len(times[1:])  # first step excluded as warm-up


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="tiny model dir (python -m trainer tiny)")
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    if importlib.util.find_spec("trl") is None:
        print("trl is not installed; skipping (pip install trl to run this benchmark)")
        sys.exit(0)
    work = Path(tempfile.mkdtemp(prefix="trl_bench_"))
    a = ours(args.model, args.steps, work / "ours")
    b = trl(args.model, args.steps, work / "trl")
    print(f"GRPO step time, 8 prompts x 8 samples, 32 new tokens, CPU: "
          f"ours {a:.3f}s, TRL {b:.3f}s, ratio ours/TRL {a / b:.2f} (target <= 1.0)")


if __name__ == "__main__":
    main()
