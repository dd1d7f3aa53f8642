"""The default's jobs at two checkouts, interleaved: wall time ratio new / old, same numbers.

    git worktree add /tmp/old 46b32a7
    python perf/default_speed.py --old /tmp/old [--new .] [--steps 20] [--repeats 3]

A reduced config/default.yaml, run as its Snakemake jobs run them (`OMP_NUM_THREADS` = the
rule's `threads:`, 1): two training jobs side by side (DAPO and GRPO, seed 0, `--steps`
steps, checkpoints at half and all the steps, MLflow on sqlite), then the evaluation job of
one run (both checkpoints, toy + AIME24, the default's eval settings). Each repeat runs
both checkouts back to back, alternating which goes first, so both see the same machine
load; each job runs in a fresh folder under `--work` with `PYTHONPATH` = its checkout.
Prints per repeat and checkout the train-pair, eval and total wall seconds, the median of
each and the ratio new / old of the medians, then whether every metrics.jsonl and
evaluation file of the last repeat is the same at both checkouts (`perf/same_numbers.py`'s
comparison, timing keys dropped).
"""

from __future__ import annotations

import argparse
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

from perf.same_numbers import differing  # noqa: E402
from sweep.expand import expand  # noqa: E402
from sweep.runconfig import eval_argv, run_config  # noqa: E402
from sweep.spec import parse_sweep  # noqa: E402

METHODS = ["DAPO", "GRPO"]


def reduced_sweep(steps: int):
    """config/default.yaml with two methods, one seed, `steps` steps, two checkpoints; the
    shipped tiny model and benchmark file by absolute path (jobs run in other folders)."""
    data = yaml.safe_load((REPO / "config/default.yaml").read_text())
    data["name"] = "speed"
    data["methods"], data["seeds"] = METHODS, [0]
    data["base"]["model"]["path"] = str(REPO / "data/tiny-model")
    data["base"]["optim"]["steps"] = steps
    data["eval"]["steps"] = [steps // 2, steps]
    data["eval"]["files"] = {b: str(REPO / f) for b, f in data["eval"]["files"].items()}
    return parse_sweep(data, "perf/default_speed.py")


def job_env(code: Path) -> dict[str, str]:
    """What Snakemake's shell gives a job with `threads: 1`, and the checkout to import."""
    threads = "1"
    return {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads}


def run_once(code: Path, work: Path, sweep, cells) -> dict[str, float]:
    """One reduced default in `work` with `code`; wall seconds of its parts."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = job_env(code)
    configs = []
    for cell in cells:
        path = work / f"{cell.run_id}.yaml"
        path.write_text(yaml.safe_dump(run_config(sweep, cell)))
        configs.append(path)
    start = time.perf_counter()
    trains = [subprocess.Popen([sys.executable, "-m", "trainer", "--config", str(p)], cwd=work,
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
              for p in configs]
    for proc in trains:
        _, err = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"{code}: trainer failed:\n{err.decode()[-2000:]}")
    trained = time.perf_counter()
    args = eval_argv(sweep, cells[0].run_id, list(sweep.eval.steps),
                     list(sweep.eval.benchmarks))
    done = subprocess.run([sys.executable, "-m", "eval", *args], cwd=work, env=env,
                          capture_output=True)
    if done.returncode:
        raise SystemExit(f"{code}: eval failed:\n{done.stderr.decode()[-2000:]}")
    end = time.perf_counter()
    return {"train_pair": trained - start, "eval": end - trained, "total": end - start}


def same_numbers(old: Path, new: Path) -> str:
    files, differ = differing(old, new)
    if not files:
        return "no files compared"
    return f"ALL IDENTICAL ({len(files)} files)" if not differ else \
        f"{len(differ)} of {len(files)} files differ: {', '.join(differ[:4])}"


def two_checkouts(description: str, work: str, **options) -> argparse.Namespace:
    """The arguments of a side-by-side script: --old, --new, --repeats, --work, `options`
    ({flag: default} of its own integers)."""
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", type=Path, required=True, help="baseline checkout")
    p.add_argument("--new", type=Path, default=REPO, help="checkout to compare (default: this)")
    for flag, default in options.items():
        p.add_argument(f"--{flag}", type=int, default=default)
    p.add_argument("--work", type=Path, default=Path(work))
    return p.parse_args()


def interleaved(a: argparse.Namespace, run, parts: tuple[str, ...]) -> None:
    """`run(code, label)` -> {part: seconds} for both checkouts, `a.repeats` times, which
    goes first alternating; prints each run, then each part's medians and ratio new / old."""
    codes = {"old": a.old.resolve(), "new": a.new.resolve()}
    times: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for r in range(a.repeats):
        for label in (["old", "new"] if r % 2 == 0 else ["new", "old"]):
            t = run(codes[label], label)
            times[label].append(t)
            print(f"repeat {r} {label}: " + ", ".join(f"{k} {v:.1f} s" for k, v in t.items()),
                  flush=True)
    for part in parts:
        old = statistics.median(t[part] for t in times["old"])
        new = statistics.median(t[part] for t in times["new"])
        print(f"{part:10s} median old {old:7.1f} s  new {new:7.1f} s  ratio {new / old:.2f}")


def main() -> None:
    a = two_checkouts(__doc__, "/tmp/default_speed", steps=20, repeats=3)
    sweep = reduced_sweep(a.steps)
    cells = expand(sweep)[0]
    interleaved(a, lambda code, label: run_once(code, a.work / label, sweep, cells),
                ("train_pair", "eval", "total"))
    print("same numbers (last repeat):", same_numbers(a.work / "old", a.work / "new"))


if __name__ == "__main__":
    main()
