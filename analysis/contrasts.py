"""The paper's contrasts inside an overlay, computed: does a design choice separate the runs in
accuracy, and in KL to the initial model, and what could this design have detected.

    python -m analysis contrasts --sweep-dir results/ablation-frontier [--benchmark toy]
        [--delta 3] [--kl-delta 0.2]

The contrasts (pairs of grid cells, found from the sweep's labels "M [tokens]"):
- the importance weight on GRPO's k3 KL term (paper Sec. 2.2): "GRPO [t]" against
  "GRPO-ISKL [t]", at each beta of the frontier overlay;
- stale rollouts (trainer.staleness): "M [staleK]" against "M [stale0]", K > 0;
- LoRA (model.lora, the `lora` axis): "M [lora-...]" against "M [full]", full fine-tuning.

Per pair, at Last (each run's final evaluated step), on one benchmark, both paired by seed
with the training run as the unit:
- accuracy Δ (cell - partner): analysis.delta's paired t over seeds of the per-seed Δ (each
  the mean over problems); the smallest Δ the design detects at 95% / 80% power
  (analysis.power's model: run-to-run, interaction and sampling components), and with
  `--delta` the seeds it would take to detect that many points;
- KL Δ (nats per response, `kl_to_initial_k1` at Last): one KL per run, so the paired t over
  the per-seed differences; the smallest Δ that test detects at 95% / 80% power (the
  noncentral t, analysis.power.t_mdd), and with `--kl-delta` the seeds it would take.
A difference *separates* at 95% when its interval excludes 0; the accuracy and KL contrasts
of one overlay are one family of K comparisons, each with its Holm-adjusted p value. One
seed: no interval (stated). analysis.verdict turns the rows into the report's sentences.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import power
from analysis.collect import collect
from analysis.delta import DELTA_COLUMNS, VERDICT_SCORER, Scores, delta_fields
from analysis.stats import delta_state, holm, paired_t
from analysis.tables import format_p, per_run_last_best
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
CSV_NAME = "contrasts.csv"  # under the report's tables/: what `analysis recompute` checks
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


def kl_mdd(sd: float, seeds: int) -> float:
    """Smallest mean KL difference the paired t test over `seeds` detects (NaN below 2)."""
    return power.t_mdd(sd, seeds)


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


KL_COLUMNS = ("kl_delta", "kl_low", "kl_high", "kl_p", "kl_p_holm", "kl_sd", "kl_seeds")


def kl_difference(runs: pd.DataFrame, partner_runs: pd.DataFrame) -> dict:
    """Per-seed KL differences at Last (cell - partner): KL_COLUMNS (Holm left NaN)."""
    mine = dict(zip(runs["seed"], runs["kl_last"]))
    theirs = dict(zip(partner_runs["seed"], partner_runs["kl_last"]))
    d = [mine[s] - theirs[s] for s in sorted(set(mine) & set(theirs))
         if not (math.isnan(mine[s]) or math.isnan(theirs[s]))]
    if not d:
        return {**dict.fromkeys(KL_COLUMNS, math.nan), "kl_seeds": 0}
    t = paired_t(d)
    return {"kl_delta": t.delta, "kl_low": t.low, "kl_high": t.high, "kl_p": t.p,
            "kl_p_holm": math.nan, "kl_sd": t.sd, "kl_seeds": t.seeds}


CONTRAST_COLUMNS = ["contrast", "label", "partner", "benchmark", "seeds", *DELTA_COLUMNS,
                    "mdd", "seeds_for_delta", *KL_COLUMNS, "kl_mdd", "seeds_for_kl_delta"]


def contrast_rows(per_run: pd.DataFrame, scores: Scores, scorer: str,
                  benchmark: str = DEFAULT_BENCHMARK, delta: float | None = None,
                  kl_delta: float | None = None) -> pd.DataFrame:
    """One row per contrast pair on `benchmark` (CONTRAST_COLUMNS; accuracy in fractions,
    KL in nats; `delta` in fractions, `kl_delta` in nats: the seeds each would need). The
    accuracy and KL p values are Holm-adjusted together: one family."""
    runs = per_run[per_run["benchmark"] == benchmark]
    rows = []
    for p in pairs(runs["label"].unique()):
        mine, theirs = runs[runs["label"] == p.label], runs[runs["label"] == p.partner]
        acc = delta_fields(mine, theirs, "last", scorer, scores)
        fitted = power.fit(mine, theirs, scorer, scores)
        mdd, need = math.nan, None
        if fitted is not None:
            row = power.PowerRow(benchmark, p.label, fitted[1], fitted[0])
            mdd = row.mdd
            if delta is not None and row.varies:
                need = power.needed(row.components, row.design, delta)["seeds"]
        kl = kl_difference(mine, theirs)
        rows.append({"contrast": p.contrast, "label": p.label, "partner": p.partner,
                     "benchmark": benchmark, "seeds": len(set(mine["seed"]) & set(theirs["seed"])),
                     **acc, "mdd": mdd, "seeds_for_delta": need, **kl,
                     "kl_mdd": kl_mdd(kl["kl_sd"], kl["kl_seeds"]),
                     "seeds_for_kl_delta": (kl_seeds_needed(kl["kl_sd"], kl_delta)
                                            if kl_delta is not None else None)})
    out = pd.DataFrame(rows, columns=CONTRAST_COLUMNS)
    adjusted = holm(np.concatenate([out["delta_p"].to_numpy(dtype=float),
                                    out["kl_p"].to_numpy(dtype=float)]))
    out["delta_p_holm"], out["kl_p_holm"] = adjusted[:len(out)], adjusted[len(out):]
    return out


def sweep_contrasts(sweep_dir: str | Path, scorer: str = VERDICT_SCORER,
                    benchmark: str = DEFAULT_BENCHMARK, delta: float | None = None,
                    kl_delta: float | None = None) -> pd.DataFrame:
    """`contrast_rows` of a finished sweep directory (empty when it holds no contrast)."""
    col = collect(sweep_dir)
    if col.eval.empty:
        return pd.DataFrame(columns=CONTRAST_COLUMNS)
    per_run = per_run_last_best(col.eval, scorer)
    return contrast_rows(per_run, Scores.from_runs(col.runs), scorer, benchmark, delta,
                         kl_delta)


def separates(low: float, high: float) -> bool:
    """The 95% interval excludes 0 (NaN bounds: no interval, so no separation)."""
    return not (math.isnan(low) or math.isnan(high)) and (low > 0 or high < 0)


def _num(x: float, fmt: str) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _cell(delta: float, low: float, high: float, p_holm: float, scale: float,
          fmt: str, seeds: int) -> str:
    """"+1.20 [-2.10, +4.50]", with " *" and the Holm p when the interval excludes 0;
    without an interval, why (one seed, the same Δ in every seed)."""
    if math.isnan(delta):
        return "n/a"
    state = delta_state(delta, low, seeds)
    if state != "tested":
        why = {"one seed": "one seed", "constant": f"constant over {seeds} seeds"}
        return f"{scale * delta:{fmt}} ({why.get(state, state)})"
    text = f"{scale * delta:{fmt}} [{scale * low:{fmt}}, {scale * high:{fmt}}]"
    return f"{text} * (Holm p {format_p(p_holm)})" if separates(low, high) else text


def markdown(rows: pd.DataFrame) -> str:
    """The contrasts as one Markdown table (accuracy in points, KL in nats; * = the interval
    excludes 0, with its Holm-adjusted p over the table's K comparisons)."""
    header = ["Contrast", "Cell", "vs", "Seeds", "Δ acc Last [95%]", "detectable",
              "Δ KL Last [95%] (nats)", "detectable (nats)"]
    lines = ["| " + " | ".join(header) + " |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows.itertuples():
        acc = _cell(r.delta, r.delta_low, r.delta_high, r.delta_p_holm, 100, "+.2f",
                    int(r.delta_seeds))
        kl = _cell(r.kl_delta, r.kl_low, r.kl_high, r.kl_p_holm, 1, "+.3f", int(r.kl_seeds))
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
