"""What a sweep's design can detect: variance components of Δ vs the baseline and power.

    python -m analysis power --sweep-dir results/<sweep> [--delta 2.0] [--scorer dapo]
        [--baseline DAPO]

Model of the paired difference of one method against the baseline at Last, on seed s and
problem p, averaged over the n evaluation samples of each run:

    d[s, p] = Δ + u[s] + v[p] + e[s, p] + (sampling noise of the 2n samples)
    Var(mean d) = seed/S + problem/P + interaction/(S P) + within/(S P n)

`seed` (between seeds: one training run shifts every problem), `problem` (a problem that
favours one method on every seed), `interaction` and `within` (one sample's variance of
the difference, p_m(1-p_m) + p_b(1-p_b), unbiased per cell) are estimated by the two-way
analysis of variance of d (expected mean squares, negatives set to 0) and the per-cell
binomial variances. With one seed the seed component cannot be estimated (0, stated).

The harness's interval (`analysis.stats.paired_bootstrap`) resamples the S*P pairs as if
exchangeable, so its half-width is about z * sqrt(Var(d) / (S P)), while the mean moves by
sqrt(Var(mean d)) from design to design. The difference this design detects with 80% power
at 95% is therefore MDD = z_0.975 * se_boot + z_0.8 * se_true, and the interval covers the
true Δ with probability 2 Phi(z_0.975 se_boot / se_true) - 1 (exactly 95% when seed and
problem components are 0). tests/analysis/test_power.py checks both against simulation.
Values are fractions; the CLI prints points.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats as _scipy_stats

from analysis.collect import collect, problem_scores
from analysis.delta import BASELINE_METHOD, VERDICT_SCORER
from analysis.stats import LEVEL
from common.layout import SweepDir

POWER = 0.8
CAPS = {"seeds": 1000, "samples": 4096, "problems": 100_000}  # search limits of --delta


@dataclass(frozen=True)
class Components:
    """Variance components of the paired difference (fractions squared), see module doc."""

    seed: float
    problem: float
    interaction: float
    within: float


@dataclass(frozen=True)
class Design:
    seeds: int
    problems: int
    samples: int


def _z(p: float) -> float:
    return float(_scipy_stats.norm.ppf(p))


def se_true(c: Components, d: Design) -> float:
    """Standard deviation of the mean difference over designs of this size."""
    s, p, n = d.seeds, d.problems, d.samples
    return math.sqrt(c.seed / s + c.problem / p + c.interaction / (s * p)
                     + c.within / (s * p * n))


def se_boot(c: Components, d: Design) -> float:
    """What the pairs bootstrap's spread estimates: Var(d) / (S P), pairs as exchangeable."""
    s, p, n = d.seeds, d.problems, d.samples
    var_d = c.seed + c.problem + c.interaction + c.within / n
    return math.sqrt(var_d / (s * p))


def mdd(c: Components, d: Design, level: float = LEVEL, power: float = POWER) -> float:
    """Smallest Δ the harness's interval excludes 0 for with probability `power`."""
    return _z(0.5 + level / 2) * se_boot(c, d) + _z(power) * se_true(c, d)


def coverage(c: Components, d: Design, level: float = LEVEL) -> float:
    """Probability that the pairs bootstrap's interval holds the true Δ."""
    t = se_true(c, d)
    return 1.0 if t == 0 else float(2 * _scipy_stats.norm.cdf(_z(0.5 + level / 2)
                                                                * se_boot(c, d) / t) - 1)


def estimate(method: np.ndarray, base: np.ndarray, n: int) -> Components:
    """Components from per-(seed, problem) Mean@n arrays of shape (S, P) of both sides."""
    m, b = np.asarray(method, dtype=float), np.asarray(base, dtype=float)
    if m.shape != b.shape or m.ndim != 2 or n < 2:
        raise ValueError(f"need (seeds, problems) arrays of one shape and n >= 2; got "
                         f"{m.shape}, {b.shape}, n={n}")
    within = float(np.mean((m * (1 - m) + b * (1 - b)) * n / (n - 1)))
    d = m - b
    s, p = d.shape
    grand = d.mean()
    if s == 1:
        ms_prob = float(d.var(ddof=1)) if p > 1 else 0.0
        return Components(0.0, max(0.0, ms_prob - within / n), 0.0, within)
    seed_eff, prob_eff = d.mean(axis=1) - grand, d.mean(axis=0) - grand
    resid = d - grand - seed_eff[:, None] - prob_eff[None, :]
    ms_seed = p * float(seed_eff @ seed_eff) / (s - 1)
    ms_prob = s * float(prob_eff @ prob_eff) / (p - 1) if p > 1 else 0.0
    ms_res = float((resid ** 2).sum()) / ((s - 1) * max(p - 1, 1))
    return Components(max(0.0, (ms_seed - ms_res) / p), max(0.0, (ms_prob - ms_res) / s),
                      max(0.0, ms_res - within / n), within)


def needed(c: Components, d: Design, delta: float) -> dict[str, int | None]:
    """For each of seeds, samples, problems (the others held at `d`): the smallest value
    whose MDD is <= delta; None when no value up to CAPS reaches it."""
    out: dict[str, int | None] = {}
    for axis in ("seeds", "samples", "problems"):
        out[axis] = None
        lo, hi = 1 if axis != "samples" else 2, CAPS[axis]
        if mdd(c, _with(d, axis, hi)) > delta:
            continue
        while lo < hi:  # MDD decreases in each axis: bisect
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if mdd(c, _with(d, axis, mid)) > delta else (lo, mid)
        out[axis] = lo
    return out


def _with(d: Design, axis: str, value: int) -> Design:
    return Design(**{**d.__dict__, axis: value})


# ---------------------------------------------------------------------------------------
# A finished sweep
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PowerRow:
    benchmark: str
    label: str
    design: Design
    components: Components

    @property
    def mdd(self) -> float:
        """NaN when the records hold no variation at all (e.g. every sample wrong on both
        sides): nothing to estimate a detectable difference from, not a zero one."""
        if not any(self.components.__dict__.values()):
            return math.nan
        return mdd(self.components, self.design)

    @property
    def coverage(self) -> float:
        return coverage(self.components, self.design)


def sweep_power(sweep_dir: str | Path, scorer: str = VERDICT_SCORER,
                baseline: str = BASELINE_METHOD) -> list[PowerRow]:
    """One row per (benchmark, method) paired with the baseline at each run's Last step,
    over the seeds and problems both sides evaluated."""
    col = collect(sweep_dir)
    ev = col.eval[col.eval["scorer"] == scorer]
    if ev.empty:
        raise ValueError(f"--scorer {scorer!r}: no evaluations of it under {sweep_dir}")
    last = ev.sort_values("step").groupby(["run_id", "benchmark"]).tail(1)
    dirs = dict(zip(col.runs["run_id"], col.runs["run_dir"]))
    rows = []
    for bench, runs in last.groupby("benchmark", sort=True):
        base = {int(r.seed): r for r in runs[runs["label"] == baseline].itertuples()}
        if not base:
            continue
        for label, mruns in runs[runs["label"] != baseline].groupby("label", sort=True):
            pairs = [(problem_scores(dirs[r.run_id], int(r.step), bench).get(scorer, {}),
                      problem_scores(dirs[base[int(r.seed)].run_id],
                                     int(base[int(r.seed)].step), bench).get(scorer, {}),
                      int(r.n))
                     for r in mruns.itertuples() if int(r.seed) in base]
            if not pairs:
                continue
            pids = sorted(set.intersection(*(set(m) & set(b) for m, b, _ in pairs)))
            n = min(k for _, _, k in pairs)
            if not pids or n < 2:
                continue
            m = np.array([[mine[q] for q in pids] for mine, _, _ in pairs])
            b = np.array([[theirs[q] for q in pids] for _, theirs, _ in pairs])
            rows.append(PowerRow(str(bench), str(label), Design(len(pairs), len(pids), n),
                                 estimate(m, b, n)))
    return rows


def detectable_by_benchmark(rows: list[PowerRow]) -> dict[str, tuple[float, float]]:
    """benchmark -> (smallest, largest) MDD over its methods: the verdict's sentence."""
    out: dict[str, tuple[float, float]] = {}
    for r in rows:
        lo, hi = out.get(r.benchmark, (math.nan, math.nan))
        if not math.isnan(r.mdd):
            lo, hi = (r.mdd, r.mdd) if math.isnan(lo) else (min(lo, r.mdd), max(hi, r.mdd))
        out[r.benchmark] = (lo, hi)
    return out  # (nan, nan): no method's records varied


def render(rows: list[PowerRow], delta: float | None) -> str:
    """Plain-text table in points (what the CLI prints)."""
    pts = 100.0
    head = (f"{'benchmark':10s} {'method':28s} {'S':>3s} {'P':>5s} {'n':>4s} {'sd_seed':>8s} "
            f"{'sd_prob':>8s} {'sd_inter':>8s} {'sd_within':>9s} {'MDD':>6s} {'cover':>6s}")
    lines = ["Minimum detectable difference of Δ vs the baseline at Last (95% interval, 80% "
             "power; points; sd_* = square roots of the variance components, within per "
             "sample; cover = coverage of the paired bootstrap's 95% interval)", head]
    for r in rows:
        c, d = r.components, r.design
        lines.append(
            f"{r.benchmark:10s} {r.label:28s} {d.seeds:3d} {d.problems:5d} {d.samples:4d} "
            f"{pts * math.sqrt(c.seed):8.2f} {pts * math.sqrt(c.problem):8.2f} "
            f"{pts * math.sqrt(c.interaction):8.2f} {pts * math.sqrt(c.within):9.2f} "
            f"{pts * r.mdd:6.2f} {r.coverage:6.3f}")
        if d.seeds == 1:
            lines.append(f"{'':10s} (one seed: the between-seed component cannot be estimated "
                         "and is taken as 0)")
        if delta is not None:
            need = needed(c, d, delta / pts)
            said = ", ".join(f"{k} {v if v is not None else f'> {CAPS[k]} (unreachable)'}"
                             for k, v in need.items())
            lines.append(f"{'':10s} to detect {delta:g} points, with the others as run: {said}")
    if not rows:
        lines.append("(no method shares seeds and problems with the baseline)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis power", description=__doc__.split(
        "\n")[0])
    p.add_argument("--sweep-dir", required=True, help="results/<sweep> (holds runs/)")
    p.add_argument("--delta", type=float, default=None,
                   help="target difference in points: the seeds/samples/problems it needs")
    p.add_argument("--scorer", default=VERDICT_SCORER, help="scorer whose records are read")
    p.add_argument("--baseline", default=BASELINE_METHOD, help="label every method is paired with")
    args = p.parse_args(argv)
    if not SweepDir(args.sweep_dir).runs.is_dir():
        print(f"error: --sweep-dir {args.sweep_dir}: no runs/ folder inside (expected "
              "results/<sweep>)", file=sys.stderr)
        return 2
    if args.delta is not None and not args.delta > 0:
        print(f"error: --delta {args.delta}: must be a positive number of points",
              file=sys.stderr)
        return 2
    try:
        rows = sweep_power(args.sweep_dir, args.scorer, args.baseline)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(render(rows, args.delta))
    return 0
