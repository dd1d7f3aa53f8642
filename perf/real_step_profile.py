"""Where a real-model training step goes: generation (vLLM's decode), the weight push, the
log-prob pass, the update and the rest, per step, from one run of config/real-cpu.yaml.

    python -m trainer prepare smollm2-135m-instruct --out results/models/smollm2-135m-instruct
    OMP_NUM_THREADS=2 python perf/real_step_profile.py [--steps 5] [--method DAPO]
    python perf/real_step_profile.py --old /tmp/old     # this checkout, then another one

Builds the sweep's run config for one method and seed 0 (the shipped model folder above,
`--steps` steps, no evaluation, no MLflow), sets up the trainer as a train job does
(`OMP_NUM_THREADS` = the rule's `threads:`, 2) and times each part of every step by wrapping
the calls that do it: `generate` on the engine (the engine's wake and sleep are no-ops on
a CPU), `sync_weights` (the push of the updated weights into vLLM), the trainer's log-prob
pass and its update (`Updater.update`, forward and backward of every micro-batch, the
optimizer step). Prints each step, then the median of steps 2.. with shares. With `--old`
the same is run with another checkout's code in a subprocess, and the two medians are printed
side by side with their ratio, and whether the two runs' metrics.jsonl are equal.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from perf.same_numbers import records  # noqa: E402

MODEL = REPO / "results/models/smollm2-135m-instruct"
PARTS = ("generation", "weight push", "log-probs", "update", "other")


def run_config_file(method: str, steps: int, work: Path, code: Path) -> Path:
    """config/real-cpu.yaml's run config for `method`, seed 0, in `work`."""
    sys.path.insert(0, str(code))
    from sweep.expand import expand
    from sweep.runconfig import run_config
    from sweep.spec import parse_sweep

    data = yaml.safe_load((code / "config/real-cpu.yaml").read_text())
    data["base"]["model"]["path"] = str(MODEL)
    data["base"]["optim"]["steps"] = steps
    data["methods"], data["seeds"] = [method], [0]
    data["eval"]["steps"] = [steps]
    data["eval"]["files"] = {b: str(code / f) for b, f in data["eval"]["files"].items()}
    data["mlflow"] = {"enabled": False}
    sweep = parse_sweep(data, "perf/real_step_profile.py")
    cfg = run_config(sweep, expand(sweep)[0][0])
    cfg["out_dir"] = str(work / "run")
    cfg["tracking"]["progress"] = False
    path = work / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def timed(obj, name: str, bucket: dict[str, float], part: str) -> None:
    """Wrap `obj.name` so that its wall seconds add to bucket[part]."""
    call = getattr(obj, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            bucket[part] += time.perf_counter() - start

    setattr(obj, name, wrapper)


def profile(config: Path) -> list[dict[str, float]]:
    """Set up the trainer from `config` and time every step's parts."""
    import torch

    from trainer.config import load_run_config
    from trainer.loop import Trainer
    from trainer.runtime import tune_cpu_runtime

    cfg = load_run_config(str(config))
    tune_cpu_runtime()
    trainer = Trainer(cfg)
    start = time.perf_counter()
    trainer.setup(track=False)
    print(f"set-up (model, vLLM engine start): {time.perf_counter() - start:.1f} s; "
          f"torch threads {torch.get_num_threads()}", flush=True)
    bucket = dict.fromkeys(PARTS, 0.0)
    engine = trainer.engine.engine
    timed(engine, "generate", bucket, "generation")
    timed(engine, "sync_weights", bucket, "weight push")
    timed(trainer.updater, "logprobs_no_grad", bucket, "log-probs")
    timed(trainer.updater, "update", bucket, "update")
    steps = []
    Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
    try:
        for _ in range(cfg.optim.steps):
            bucket.update(dict.fromkeys(PARTS, 0.0))
            start = time.perf_counter()
            metrics = trainer.step()
            total = time.perf_counter() - start
            row = {**bucket, "other": total - sum(bucket.values()), "step": total}
            steps.append(row)
            print(f"step {metrics['step']}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()),
                  flush=True)
            with open(Path(cfg.out_dir) / "metrics.jsonl", "a") as f:
                f.write(json.dumps(metrics) + "\n")
    finally:
        trainer.close()
    return steps


def medians(steps: list[dict[str, float]]) -> dict[str, float]:
    later = steps[1:] or steps
    return {k: statistics.median(s[k] for s in later) for k in (*PARTS, "step")}


def same_metrics(a: Path, b: Path) -> str:
    return "metrics.jsonl equal" if records(a) == records(b) else "metrics.jsonl DIFFER"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python perf/real_step_profile.py",
                                description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--method", default="RPG-REINFORCE-URKL")
    p.add_argument("--work", type=Path, default=Path("/tmp/real_step_profile"))
    p.add_argument("--old", type=Path, help="another checkout, profiled after this one")
    p.add_argument("--code", type=Path, default=REPO, help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, help=argparse.SUPPRESS)  # the --old subprocess
    a = p.parse_args(argv)
    if not MODEL.is_dir():
        print(f"error: {MODEL} is missing; run `python -m trainer prepare "
              f"smollm2-135m-instruct --out {MODEL}` first", file=sys.stderr)
        return 2
    os.environ.setdefault("OMP_NUM_THREADS", "2")  # resources.train.cpus of real-cpu
    work = a.work / a.code.name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    config = run_config_file(a.method, a.steps, work, a.code)
    steps = profile(config)
    result = medians(steps)
    if a.json:
        a.json.write_text(json.dumps(result))
        return 0
    table = {"this": result}
    if a.old:
        out = a.work / "old.json"
        subprocess.run([sys.executable, __file__, "--steps", str(a.steps), "--method", a.method,
                        "--work", str(a.work), "--code", str(a.old.resolve()),
                        "--json", str(out)], check=True, env={**os.environ,
                                                             "PYTHONPATH": str(a.old.resolve())})
        table["old"] = json.loads(out.read_text())
    print(f"\nmedian of steps 2-{a.steps}, seconds (share of a step):")
    print(f"{'part':12s}" + "".join(f"{k:>18s}" for k in table)
          + ("   new / old" if "old" in table else ""))
    for part in (*PARTS, "step"):
        cells = "".join(f"{t[part]:9.2f} ({t[part] / t['step']:5.1%})" for t in table.values())
        ratio = f"   {table['this'][part] / table['old'][part]:.2f}" if "old" in table \
            and table["old"][part] > 0 else ""
        print(f"{part:12s}{cells}{ratio}")
    if a.old:
        print(same_metrics(a.work / a.old.resolve().name / "run/metrics.jsonl",
                           work / "run/metrics.jsonl"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
