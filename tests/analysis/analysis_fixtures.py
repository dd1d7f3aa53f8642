"""Helpers for the analysis tests: fixture sweeps in the documented run-directory formats.

The default sweep (numbers chosen so Last/Best, ties and mean ± se are easy by hand):

  run            label      seed  aime24 dapo @10/@20   amc23 dapo @10/@20   notes
  urkl_s0        RPG-URKL   0     0.50 / 0.40           0.70 / 0.80
  urkl_s1        RPG-URKL   1     0.30 / 0.60           0.60 / 0.90          metrics cut
  grpo_s0        GRPO       0     0.20 / 0.45           0.50 / 0.65
  dapo_s0        DAPO       0     0.55 / 0.50           0.75 / 0.70
  rpp_s0         REINFORCE++ 0    (no evaluations)
  broken         (no config.yaml)

math_verify means are the dapo ones minus 0.05. Training metrics: 3 steps per run.

Every evaluation also writes its per-sample records (`sample_records`): 5 problems x 4
samples, the correct answers filled problem by problem, so a mean of 0.45 (9 of 20 correct)
gives per-problem Mean@4 of 1, 1, 0.25, 0, 0.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

REFERENCE_CSV = Path(__file__).resolve().parents[2] / "results" / "reference" / "reported_results.csv"

EVALS = {
    "urkl_s0": {"aime24": {10: 0.50, 20: 0.40}, "amc23": {10: 0.70, 20: 0.80}},
    "urkl_s1": {"aime24": {10: 0.30, 20: 0.60}, "amc23": {10: 0.60, 20: 0.90}},
    "grpo_s0": {"aime24": {10: 0.20, 20: 0.45}, "amc23": {10: 0.50, 20: 0.65}},
    "dapo_s0": {"aime24": {10: 0.55, 20: 0.50}, "amc23": {10: 0.75, 20: 0.70}},
}
RUNS = {  # run_id: (label, seed, tags)
    "urkl_s0": ("RPG-URKL", 0, {"method": "RPG-URKL", "beta": "1e-4"}),
    "urkl_s1": ("RPG-URKL", 1, {"method": "RPG-URKL", "beta": "1e-4"}),
    "grpo_s0": ("GRPO", 0, {"method": "GRPO"}),
    "dapo_s0": ("DAPO", 0, {"method": "DAPO"}),
    "rpp_s0": ("REINFORCE++", 0, {"method": "REINFORCE++"}),
}


def summary(bench: str, step: int, mean: float, n: int = 4, kl: float | None = None) -> dict:
    """An evaluation summary in the shared schema; math_verify = dapo - 0.05; `kl`: its
    KL to the initial model (k1, nats per response), none when None."""

    def block(m: float) -> dict:
        return {
            "mean": m,
            "mean_stderr": 0.01,
            "mean_ci95_low": m - 0.02,
            "mean_ci95_high": m + 0.02,
            "pass_at_1": m,
            "pass_at_2": min(1.0, m + 0.1),
            "pass_at_4": min(1.0, m + 0.2),
            "maj_at_4": m,
            "extract_fail_rate": 0.1,
            "timeout_rate": 0.0,
        }

    out = {
        "benchmark": bench,
        "step": step,
        "checkpoint": f"checkpoints/step_{step}",
        "model_sha256": "0" * 64,
        "source": {"kind": "local", "path_or_id": f"{bench}.jsonl", "sha256": "1" * 64},
        "sampling": {
            "backend": "hf",
            "n": n,
            "temperature": 1.0,
            "top_p": 1.0,
            "max_new_tokens": 64,
            "seed": 0,
            "template": "dapo",
        },
        "num_problems": 5,
        "truncation_rate": 0.05,
        "scorers": {"dapo": block(mean), "math_verify": block(round(mean - 0.05, 10))},
    }
    if kl is not None:
        out["kl_to_initial"] = {"kl_to_initial_k1": kl, "kl_to_initial_k1_stderr": 0.01,
                                "kl_to_initial_k3": kl, "kl_to_initial_k3_stderr": 0.01}
    return out


NUM_PROBLEMS, N_SAMPLES = 5, 4


def per_problem(mean: float) -> list[float]:
    """Per-problem Mean@4 of 5 problems whose correct samples fill problem by problem."""
    correct = round(mean * NUM_PROBLEMS * N_SAMPLES)
    return [min(N_SAMPLES, max(0, correct - N_SAMPLES * i)) / N_SAMPLES
            for i in range(NUM_PROBLEMS)]


def sample_records(bench: str, means: dict[str, float]) -> list[dict]:
    """Per-sample records in the evaluation's format for {scorer: mean}."""
    records = []
    for i in range(NUM_PROBLEMS):
        for j in range(N_SAMPLES):
            scorers = {
                name: {"extracted": "1", "correct": j < per_problem(m)[i] * N_SAMPLES,
                       "status": "ok"}
                for name, m in means.items()
            }
            records.append({"problem_id": f"{bench}-{i}", "sample_index": j, "gold": "1",
                            "completion": "...", "num_tokens": 3, "finish_reason": "stop",
                            "scorers": scorers})
    return records


def metrics_line(step: int, seed: int) -> dict:
    return {
        "step": step,
        "reward_mean": 0.1 * step + 0.01 * seed,
        "reward_std": 0.3,
        "acc_mean": 0.1 * step,
        "entropy": 1.0 - 0.1 * step,
        "response_length_mean": 20.0 + step,
        "response_length_max": 40,
        "time_step": 1.5,
        "nonfinite_skips": 0,
        "ref_updates": step,
    }


def write_run(
    runs_root: Path,
    run_id: str,
    label: str,
    seed: int,
    tags: dict,
    steps: int = 3,
    evals: dict | None = None,
    done: bool = True,
    kls: dict | None = None,
) -> Path:
    """One run directory; `evals` {bench: {step: mean}}, `kls` {bench: {step: KL}}."""
    run = runs_root / run_id
    run.mkdir(parents=True)
    cfg = {"run_id": run_id, "label": label, "seed": seed, "tags": tags, "out_dir": str(run)}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    lines = [json.dumps(metrics_line(s, seed)) for s in range(1, steps + 1)]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    for bench, by_step in (evals or {}).items():
        for step, mean in by_step.items():
            d = run / "eval" / f"step_{step}"
            d.mkdir(parents=True, exist_ok=True)
            kl = (kls or {}).get(bench, {}).get(step)
            (d / f"{bench}.json").write_text(json.dumps(summary(bench, step, mean, kl=kl)))
            records = sample_records(bench, {"dapo": mean, "math_verify": round(mean - 0.05, 10)})
            (d / f"{bench}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if done:
        (run / "DONE").write_text("")
    return run


def write_sweep(root: Path) -> Path:
    """The default sweep above at `root` (holding runs/); returns root."""
    runs = root / "runs"
    for run_id, (label, seed, tags) in RUNS.items():
        write_run(runs, run_id, label, seed, tags, evals=EVALS.get(run_id))
    # A crash mid-write: the last line of urkl_s1 is cut (3 steps logged, 2 readable).
    path = runs / "urkl_s1" / "metrics.jsonl"
    path.write_text(path.read_text().rstrip("\n")[:-12])
    (runs / "broken").mkdir()
    (runs / "broken" / "metrics.jsonl").write_text(json.dumps(metrics_line(1, 0)) + "\n")
    return root
