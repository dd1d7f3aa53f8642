"""The paper's contrasts inside an overlay, computed: does a design choice separate the runs in
accuracy, and in KL to the initial model, and what could this design have detected.

    python -m analysis contrasts --sweep-dir results/ablation-frontier [--benchmark toy]
        [--delta 3] [--kl-delta 0.2]

The contrasts (pairs of grid cells, found from the sweep's labels "M [tokens]"):
- the importance weight on GRPO's k3 KL term (paper Sec. 2.2): "GRPO [t]" against
  "GRPO-ISKL [t]", at each beta of the frontier overlay;
- stale rollouts (trainer.staleness): "M [staleK]" against "M [stale0]", K > 0;
- LoRA (model.lora, the `lora` axis): "M [lora-...]" against "M [full]", full fine-tuning.

Per pair, at Last (each run's final evaluated step), on one benchmark:
- accuracy Δ (cell - partner): analysis.delta's paired bootstrap over (problem, seed); the
  smallest Δ the design detects at 95% / 80% power (analysis.power's model of the paired
  difference: seed, problem, interaction and sampling components), and with `--delta` the
  seeds it would take to detect that many points;
- KL Δ (nats per response, `kl_to_initial_k1` at Last): paired by seed, the mean
  difference and its 95% t interval over seeds (one KL per run: the seed is the unit); the
  smallest Δ a paired t test detects at 95% / 80% power, (t_0.975 + t_0.8) sd / sqrt(S)
  with S - 1 degrees of freedom, and with `--kl-delta` the seeds it would take.
A difference *separates* at 95% when its interval excludes 0. One seed: no KL interval and
no seed component (stated). analysis.verdict turns the rows into the report's sentences.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as _scipy_stats

from analysis import power
from analysis.collect import collect
from analysis.delta import VERDICT_SCORER, DeltaOptions, ScoreCache, delta_fields
from analysis.stats import LEVEL
from analysis.tables import per_run_last_best
from analysis.within import split_label
from common.layout import SweepDir

# (the cell's method, its partner's method): the paper's corrected KL term against GRPO's
METHOD_PAIRS = {"GRPO": "GRPO-ISKL"}
# an axis token whose level every other level of the axis is compared with, and its stem
AXIS_REFERENCES = {"stale": "stale0", "lora": "full"}
CONTRAST_NAMES = {"method": "importance weight on GRPO's k3 term (GRPO vs GRPO-ISKL)",
                  "stale": "stale rollouts (k steps behind vs on-policy)",
                  "lora": "LoRA adapters vs full fine-tuning"}
SEED_CAP = 1000  # search limit of the seeds a target needs
DEFAULT_BENCHMARK = "toy"


@dataclass(frozen=True)
class Pair:
    contrast: str  # a CONTRAST_NAMES key
    label: str
    partner: str


def pairs(labels) -> list[Pair]:
    """Every contrast the labels hold, in label order: a GRPO cell with its GRPO-ISKL twin
    (same bracketed tokens), a staleK cell with its stale0 twin and a lora-... cell with its
    full twin (same method and other tokens)."""
    present = set(labels)
    out = []
    for label in sorted(present):
        method, tokens = split_label(label)
        suffix = f" [{' '.join(tokens)}]" if tokens else ""
        twin = METHOD_PAIRS.get(method)
        if twin and f"{twin}{suffix}" in present:
            out.append(Pair("method", label, f"{twin}{suffix}"))
        for stem, reference in AXIS_REFERENCES.items():
            hits = [i for i, t in enumerate(tokens) if t.startswith(stem) and t != reference]
            if hits:
                ref = [*tokens[:hits[0]], reference, *tokens[hits[0] + 1:]]
                partner = f"{method} [{' '.join(ref)}]"
                if partner in present:
                    out.append(Pair(stem, label, partner))
    return out


def _t(p: float, df: int) -> float:
    return float(_scipy_stats.t.ppf(p, df))


def kl_mdd(sd: float, seeds: int, level: float = LEVEL, pw: float = power.POWER) -> float:
    """Smallest mean KL difference a paired t test over `seeds` detects (NaN below 2)."""
    if seeds < 2 or math.isnan(sd):
        return math.nan
    return (_t(0.5 + level / 2, seeds - 1) + _t(pw, seeds - 1)) * sd / math.sqrt(seeds)


def kl_seeds_needed(sd: float, delta: float) -> int | None:
    """Seeds a paired t test needs to detect `delta` nats at 95% / 80%; None past SEED_CAP
    or without an sd (one seed)."""
    if math.isnan(sd):
        return None
    if sd == 0:
        return 2
    for s in range(2, SEED_CAP + 1):
        if kl_mdd(sd, s) <= delta:
            return s
    return None


def kl_difference(runs: pd.DataFrame, partner_runs: pd.DataFrame) -> dict:
    """Per-seed KL differences at Last (cell - partner): mean, 95% t interval, sd, seeds."""
    mine = dict(zip(runs["seed"], runs["kl_last"]))
    theirs = dict(zip(partner_runs["seed"], partner_runs["kl_last"]))
    d = np.array([mine[s] - theirs[s] for s in sorted(set(mine) & set(theirs))
                  if not (math.isnan(mine[s]) or math.isnan(theirs[s]))])
    if len(d) == 0:
        return {"kl_delta": math.nan, "kl_low": math.nan, "kl_high": math.nan,
                "kl_sd": math.nan, "kl_seeds": 0}
    if len(d) == 1:
        return {"kl_delta": float(d[0]), "kl_low": math.nan, "kl_high": math.nan,
                "kl_sd": math.nan, "kl_seeds": 1}
    sd = float(d.std(ddof=1))
    half = _t(0.5 + LEVEL / 2, len(d) - 1) * sd / math.sqrt(len(d))
    mean = float(d.mean())
    return {"kl_delta": mean, "kl_low": mean - half, "kl_high": mean + half, "kl_sd": sd,
            "kl_seeds": len(d)}


def accuracy_power(runs: pd.DataFrame, partner_runs: pd.DataFrame, scorer: str,
                   scores: ScoreCache) -> tuple[power.Components, power.Design] | None:
    """analysis.power's variance components of the paired per-(seed, problem) difference at
    Last, and the design they came from; None when the two share no problem."""
    base = {int(r.seed): r for r in partner_runs.itertuples()}
    grids = []
    for r in runs.sort_values("seed").itertuples():
        b = base.get(int(r.seed))
        if b is not None:
            grids.append((scores(r.run_id, int(r.last_step), r.benchmark).get(scorer, {}),
                          scores(b.run_id, int(b.last_step), b.benchmark).get(scorer, {})))
    if not grids:
        return None
    pids = sorted(set.intersection(*(set(m) & set(b) for m, b in grids)))
    n = int(min(runs["n"].min(), partner_runs["n"].min()))
    if not pids or n < 2:
        return None
    m = np.array([[mine[q] for q in pids] for mine, _ in grids])
    b = np.array([[theirs[q] for q in pids] for _, theirs in grids])
    return power.estimate(m, b, n), power.Design(len(grids), len(pids), n)


CONTRAST_COLUMNS = ["contrast", "label", "partner", "benchmark", "seeds", "delta",
                    "delta_low", "delta_high", "delta_pairs", "mdd", "seeds_for_delta",
                    "kl_delta", "kl_low", "kl_high", "kl_sd", "kl_seeds", "kl_mdd",
                    "seeds_for_kl_delta"]


def contrast_rows(per_run: pd.DataFrame, run_dirs: dict[str, Path], scorer: str,
                  benchmark: str = DEFAULT_BENCHMARK, delta: float | None = None,
                  kl_delta: float | None = None, opts: DeltaOptions | None = None
                  ) -> pd.DataFrame:
    """One row per contrast pair on `benchmark` (CONTRAST_COLUMNS; accuracy in fractions,
    KL in nats; `delta` in fractions, `kl_delta` in nats: the seeds each would need)."""
    opts = opts or DeltaOptions()
    runs = per_run[per_run["benchmark"] == benchmark]
    scores, rows = ScoreCache(run_dirs), []
    for p in pairs(runs["label"].unique()):
        mine, theirs = runs[runs["label"] == p.label], runs[runs["label"] == p.partner]
        acc = delta_fields(mine, theirs, "last", scorer, scores, opts)
        fit = accuracy_power(mine, theirs, scorer, scores)
        mdd, need = math.nan, None
        if fit is not None:
            components, design = fit
            if any(components.__dict__.values()):
                mdd = power.mdd(components, design)
                if delta is not None:
                    need = power.needed(components, design, delta)["seeds"]
        kl = kl_difference(mine, theirs)
        rows.append({"contrast": p.contrast, "label": p.label, "partner": p.partner,
                     "benchmark": benchmark, "seeds": len(set(mine["seed"]) & set(theirs["seed"])),
                     **acc, "mdd": mdd, "seeds_for_delta": need, **kl,
                     "kl_mdd": kl_mdd(kl["kl_sd"], kl["kl_seeds"]),
                     "seeds_for_kl_delta": (kl_seeds_needed(kl["kl_sd"], kl_delta)
                                            if kl_delta is not None else None)})
    return pd.DataFrame(rows, columns=CONTRAST_COLUMNS)


def sweep_contrasts(sweep_dir: str | Path, scorer: str = VERDICT_SCORER,
                    benchmark: str = DEFAULT_BENCHMARK, delta: float | None = None,
                    kl_delta: float | None = None, opts: DeltaOptions | None = None
                    ) -> pd.DataFrame:
    """`contrast_rows` of a finished sweep directory (empty when it holds no contrast)."""
    col = collect(sweep_dir)
    if col.eval.empty:
        return pd.DataFrame(columns=CONTRAST_COLUMNS)
    per_run = per_run_last_best(col.eval, scorer)
    run_dirs = dict(zip(col.runs["run_id"], col.runs["run_dir"]))
    return contrast_rows(per_run, run_dirs, scorer, benchmark, delta, kl_delta, opts)


def separates(low: float, high: float) -> bool:
    """The 95% interval excludes 0 (NaN bounds: no interval, so no separation)."""
    return not (math.isnan(low) or math.isnan(high)) and (low > 0 or high < 0)


def _num(x: float, fmt: str) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def markdown(rows: pd.DataFrame) -> str:
    """The contrasts as one Markdown table (accuracy in points, KL in nats; * = separates)."""
    header = ["Contrast", "Cell", "vs", "Seeds", "Δ acc Last [95%]", "detectable",
              "Δ KL Last [95%] (nats)", "detectable (nats)"]
    lines = ["| " + " | ".join(header) + " |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows.itertuples():
        acc = (f"{100 * r.delta:+.2f} [{100 * r.delta_low:+.2f}, {100 * r.delta_high:+.2f}]"
               f"{' *' if separates(r.delta_low, r.delta_high) else ''}"
               if r.delta_pairs else "n/a")
        kl = (f"{r.kl_delta:+.3f} [{_num(r.kl_low, '+.3f')}, {_num(r.kl_high, '+.3f')}]"
              f"{' *' if separates(r.kl_low, r.kl_high) else ''}" if r.kl_seeds else "n/a")
        lines.append(f"| {CONTRAST_NAMES[r.contrast]} | {r.label} | {r.partner} | {r.seeds} | "
                     f"{acc} | {_num(100 * r.mdd, '.2f')} | {kl} | {_num(r.kl_mdd, '.3f')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis contrasts", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep-dir", required=True, help="results/<sweep> (holds runs/)")
    p.add_argument("--benchmark", default=DEFAULT_BENCHMARK)
    p.add_argument("--scorer", default=VERDICT_SCORER)
    p.add_argument("--delta", type=float, default=None,
                   help="accuracy difference in points: the seeds each contrast needs")
    p.add_argument("--kl-delta", type=float, default=None,
                   help="KL difference in nats: the seeds each contrast needs")
    args = p.parse_args(argv)
    if not SweepDir(args.sweep_dir).runs.is_dir():
        print(f"error: --sweep-dir {args.sweep_dir}: no runs/ folder (run the sweep first)",
              file=sys.stderr)
        return 2
    for name, value in (("--delta", args.delta), ("--kl-delta", args.kl_delta)):
        if value is not None and not value > 0:
            print(f"error: {name} {value}: must be positive", file=sys.stderr)
            return 2
    try:
        rows = sweep_contrasts(args.sweep_dir, args.scorer, args.benchmark,
                               None if args.delta is None else args.delta / 100, args.kl_delta)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if rows.empty:
        print("no contrast in this sweep (GRPO with GRPO-ISKL, a staleness or a lora axis)")
        return 0
    print(markdown(rows), end="")
    if args.delta is not None or args.kl_delta is not None:
        print()
        for r in rows.itertuples():
            need = [f"{what}: {_need(v)}" for what, v, asked in
                    ((f"{args.delta:g} points", r.seeds_for_delta, args.delta),
                     (f"{args.kl_delta:g} nats", r.seeds_for_kl_delta, args.kl_delta))
                    if asked is not None]
            print(f"{r.label} vs {r.partner}: seeds to detect {'; '.join(need)}")
    return 0


def _need(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return f"> {SEED_CAP} or not estimable (one seed)"
    return str(int(v))
