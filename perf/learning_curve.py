"""Learning target of the tiny default: held-out accuracy before/after 100 RL steps.

    python perf/learning_curve.py                       # builds the tiny model first
    python perf/learning_curve.py --model DIR --methods RPG-REINFORCE-URKL GRPO DAPO

For each method: one run of `--steps` steps with the trainer's tiny defaults (the method's
own loss, advantage and reference schedule from algorithms.METHODS), then held-out
accuracy = sampled (temperature 1.0) mean accuracy over `--n` samples for each of the 121
held-out toy problems (`common.toy.problems("test", 121, seed=0)`), dapo scorer. Prints
one table: before, after, gain in points, RL wall time.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from tabulate import tabulate
from transformers import AutoModelForCausalLM, AutoTokenizer

from common import toy
from trainer.config import parse_run_config
from trainer.heldout import heldout_accuracy
from trainer.loop import train
from trainer.runtime import tune_cpu_runtime
from trainer.tiny import TinyConfig, build_tiny


def heldout(path: Path, n: int, problems: int) -> float:
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return heldout_accuracy(model, tokenizer, toy.problems("test", problems, seed=0), n=n,
                            temperature=1.0, max_new_tokens=32, seed=1234)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="tiny model dir (default: build one)")
    p.add_argument("--methods", nargs="+", default=["RPG-REINFORCE-URKL", "GRPO", "DAPO"])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n", type=int, default=4, help="samples per held-out problem")
    p.add_argument("--problems", type=int, default=toy.pool_size("test"))
    p.add_argument("--out", type=Path, default=None, help="keep runs here (default: temp dir)")
    p.add_argument("--set", nargs="*", default=[], metavar="SECTION.KEY=VALUE",
                   help="extra run-config overrides, e.g. optim.lr=3e-4")
    args = p.parse_args()
    tune_cpu_runtime()
    work = args.out or Path(tempfile.mkdtemp(prefix="learning_curve_"))
    model = args.model
    if model is None:
        t0 = time.perf_counter()
        model = build_tiny(work / "tiny", TinyConfig(), progress=False)
        print(f"built tiny model in {time.perf_counter() - t0:.1f}s")
    before = heldout(model, args.n, args.problems)
    rows = []
    for name in args.methods:
        cfg = {"run_id": name, "seed": args.seed, "out_dir": str(work / "runs" / name),
               "model": {"path": str(model)}, "method": {"name": name},
               "optim": {"steps": args.steps}, "tracking": {"mlflow_uri": None, "progress": False}}
        for item in args.set:
            key, value = item.split("=", 1)
            section, field = key.split(".", 1)
            cfg.setdefault(section, {})[field] = type_of(value)
        t0 = time.perf_counter()
        out = train(parse_run_config(cfg, f"--method {name}"))
        wall = time.perf_counter() - t0
        after = heldout(out / "checkpoints" / f"step_{args.steps}", args.n, args.problems)
        rows.append([name, f"{before:.3f}", f"{after:.3f}", f"{100 * (after - before):+.1f}",
                     f"{wall:.0f}s"])
        print(tabulate(rows[-1:], tablefmt="plain"), flush=True)
    print(f"\nheld-out = sampled mean@{args.n} (T=1.0) on {args.problems} toy test problems; "
          f"{args.steps} RL steps, seed {args.seed}")
    print(tabulate(rows, headers=["method", "before", "after", "gain (pts)", "RL wall time"],
                   tablefmt="github"))


def type_of(value: str):
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return {"true": True, "false": False, "null": None}.get(value, value)


if __name__ == "__main__":
    main()
