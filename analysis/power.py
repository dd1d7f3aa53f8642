"""What a sweep's design can detect, with the training run as the unit: the variance components
of Δ vs the baseline, the smallest detectable Δ, and the seeds, problems or samples a target
Δ needs.

    python -m analysis power --sweep-dir results/<sweep> [--delta 2.0] [--scorer dapo]
        [--baseline DAPO]

Model of the paired difference of one method against the baseline at Last, on seed s and
problem p, averaged over the n evaluation samples of each run:

    d[s, p] = Δ + u[s] + v[p] + e[s, p] + (sampling noise of the 2n samples)

`seed` (u: one training run shifts every problem; the run-to-run component), `problem` (v: a
problem that favours one method on every seed), `interaction` (e) and `within` (one
sample's variance of the difference, p_m(1-p_m) + p_b(1-p_b), unbiased per cell) are
estimated by the two-way analysis of variance of d (expected mean squares, negatives set
to 0) and the per-cell binomial variances. With one seed the seed component cannot be
estimated (0, stated) and no interval exists.

The report's interval is the paired t over the per-seed Δ_s = mean over problems of d[s, p]
(`analysis.stats.seed_delta`), whose variance is

    Var(Δ_s) = seed + interaction / P + within / (P n)

(v[p] is the same in every seed: part of the Δ this benchmark measures, not noise). The
smallest Δ it detects at 95% with 80% power (MDD) is where a two-sided t test on S values
with S - 1 degrees of freedom rejects 80% of the time: the noncentral t, exact under
normality, so a design that claims an MDD detects it 80% of the time (`python -m analysis
calibrate` checks it). Problems and samples shrink only the last two terms: with S seeds no
benchmark, however large, gets below the floor, the MDD with Var(Δ_s) = seed; where the seed
component is most of Var(Δ_s), more problems cannot help and the planner says so. Values are
fractions; the CLI prints points.
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
from scipy.optimize import brentq

from analysis.delta import BASELINE_METHOD, VERDICT_SCORER, Scores
from analysis.snapshot import read_sweep_or_published
from analysis.stats import LEVEL
from analysis.tables import per_run_last_best

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


def delta_sd(c: Components, d: Design) -> float:
    """Standard deviation of one seed's Δ_s (the paired t's unit), see module doc."""
    return math.sqrt(c.seed + c.interaction / d.problems
                     + c.within / (d.problems * d.samples))


def run_share(c: Components, d: Design) -> float:
    """The run-to-run component's share of Var(Δ_s) (NaN when there is no variance)."""
    var = delta_sd(c, d) ** 2
    return c.seed / var if var > 0 else math.nan


def t_power(delta: float, sd: float, seeds: int, level: float = LEVEL) -> float:
    """Probability that the paired t interval over `seeds` per-seed differences of sd `sd`
    excludes 0 when their mean is `delta` (noncentral t, two-sided)."""
    df = seeds - 1
    crit = float(_scipy_stats.t.ppf(0.5 + level / 2, df))
    ncp = abs(delta) / (sd / math.sqrt(seeds))
    # the far tail (wrong sign) is < 2.5%; scipy's nct returns NaN for it deep in the tail
    wrong_side = float(np.nan_to_num(_scipy_stats.nct.cdf(-crit, df, ncp)))
    return float(_scipy_stats.nct.sf(crit, df, ncp)) + wrong_side


def t_mdd(sd: float, seeds: int, level: float = LEVEL, power: float = POWER) -> float:
    """The Δ a paired t test over `seeds` values of sd `sd` detects with probability `power`
    (NaN below 2 seeds or without an sd; 0 when the values cannot vary)."""
    if seeds < 2 or math.isnan(sd):
        return math.nan
    if sd == 0:
        return 0.0
    hi = sd
    while t_power(hi, sd, seeds, level) < power:
        hi *= 2
    return float(brentq(lambda x: t_power(x, sd, seeds, level) - power, 0.0, hi, xtol=1e-12))


def mdd(c: Components, d: Design, level: float = LEVEL, power: float = POWER) -> float:
    """Smallest Δ the report's interval excludes 0 for with probability `power`."""
    return t_mdd(delta_sd(c, d), d.seeds, level, power)


def floor(c: Components, seeds: int, level: float = LEVEL, power: float = POWER) -> float:
    """The MDD with every problem and sample in the world: the run-to-run component alone."""
    return t_mdd(math.sqrt(c.seed), seeds, level, power)


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


def sd_interval(sd: float, seeds: int, level: float = LEVEL) -> tuple[float, float]:
    """The `level` interval of the true sd of Δ_s from its estimate on seeds - 1 degrees of
    freedom (chi-square: (S - 1) sd^2 / sigma^2 ~ chi2(S - 1) under normality)."""
    df = seeds - 1
    if df < 1 or math.isnan(sd):
        return math.nan, math.nan
    hi_q, lo_q = _scipy_stats.chi2.ppf([0.5 + level / 2, 0.5 - level / 2], df)
    return sd * math.sqrt(df / hi_q), sd * math.sqrt(df / lo_q)


def mdd_interval(c: Components, d: Design, level: float = LEVEL) -> tuple[float, float]:
    """The detectable Δ's own interval: the MDD at each end of `sd_interval` (it scales with
    the sd). With 3 seeds the upper end is about 4.4 times the point figure."""
    lo, hi = sd_interval(delta_sd(c, d), d.seeds, level)
    return t_mdd(lo, d.seeds, level), t_mdd(hi, d.seeds, level)


_BINS = 400  # equal-probability bins of the sd's sampling distribution (expected_power)


def expected_power(delta: float, sd: float, seeds: int, level: float = LEVEL) -> float:
    """The power at `delta` averaged over what the true sd may be, given `sd` estimated on
    seeds - 1 df (sigma^2 = (S - 1) sd^2 / chi2(S - 1)): what a design sized on the point
    figure really gets. Below the nominal 80% at the point MDD, most with few seeds."""
    df = seeds - 1
    if df < 1 or math.isnan(sd) or sd == 0:
        return math.nan
    chi = _scipy_stats.chi2.ppf((np.arange(_BINS) + 0.5) / _BINS, df)
    return float(np.mean([t_power(delta, sd * math.sqrt(df / q), seeds, level) for q in chi]))


def trade(c: Components, d: Design) -> dict[str, float]:
    """The MDD after one more seed (a training run and its evaluation) and after twice the
    samples per problem (evaluation only), beside today's: which buys power faster."""
    return {"now": mdd(c, d), "one more seed": mdd(c, _with(d, "seeds", d.seeds + 1)),
            "twice the samples": mdd(c, _with(d, "samples", 2 * d.samples))}


def needed(c: Components, d: Design, delta: float) -> dict[str, int | None]:
    """For each of seeds, samples, problems (the others held at `d`): the smallest value
    whose MDD is <= delta; None when no value up to CAPS reaches it (for problems and
    samples: also when the run-to-run floor alone is above delta)."""
    out: dict[str, int | None] = {}
    for axis in ("seeds", "samples", "problems"):
        out[axis] = None
        lo, hi = (2 if axis != "problems" else 1), CAPS[axis]
        if not mdd(c, _with(d, axis, hi)) <= delta:
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
    def varies(self) -> bool:
        """False when the records hold no variation at all (e.g. every sample wrong on both
        sides): nothing to estimate a detectable difference from, not a zero one."""
        return any(self.components.__dict__.values())

    @property
    def mdd(self) -> float:
        return mdd(self.components, self.design) if self.varies else math.nan

    @property
    def mdd_interval(self) -> tuple[float, float]:
        """The MDD's 95% interval from the sd's chi-square interval on S - 1 df."""
        return mdd_interval(self.components, self.design) if self.varies else (math.nan,) * 2

    @property
    def power_at_mdd(self) -> float:
        """The power the point MDD really gives, over the sd's uncertainty."""
        if not self.varies:
            return math.nan
        return expected_power(self.mdd, delta_sd(self.components, self.design), self.design.seeds)

    @property
    def floor(self) -> float:
        """The MDD of these seeds with unlimited problems and samples."""
        return floor(self.components, self.design.seeds) if self.varies else math.nan

    @property
    def run_share(self) -> float:
        return run_share(self.components, self.design)


def fit(runs: pd.DataFrame, base_runs: pd.DataFrame, scorer: str,
        scores: Scores) -> tuple[Components, Design] | None:
    """The variance components of `runs` - `base_runs` at Last, paired by seed over the
    problems every pair evaluated, and the design they came from; None when they share no
    problem or n < 2. Both frames are `tables.per_run_last_best` rows of one benchmark."""
    base = {int(r.seed): r for r in base_runs.itertuples()}
    grids = []
    for r in runs.sort_values("seed").itertuples():
        b = base.get(int(r.seed))
        if b is not None:
            grids.append((scores(r.run_id, int(r.last_step), r.benchmark).get(scorer, {}),
                          scores(b.run_id, int(b.last_step), b.benchmark).get(scorer, {})))
    if not grids:
        return None
    pids = sorted(set.intersection(*(set(m) & set(b) for m, b in grids)))
    ns = pd.concat([runs["n"], base_runs["n"]]).dropna()
    n = int(ns.min()) if not ns.empty else 0
    if not pids or n < 2:
        return None
    m = np.array([[mine[q] for q in pids] for mine, _ in grids])
    b = np.array([[theirs[q] for q in pids] for _, theirs in grids])
    return estimate(m, b, n), Design(len(grids), len(pids), n)


def power_rows(per_run: pd.DataFrame, scores: Scores, scorer: str,
               baseline: str = BASELINE_METHOD) -> list[PowerRow]:
    """One row per (benchmark, method) paired with the baseline at each run's Last step
    (`per_run`: `tables.per_run_last_best` of `scorer`)."""
    rows = []
    for bench, runs in per_run.groupby("benchmark", sort=True):
        base = runs[runs["label"] == baseline]
        if base.empty:
            continue
        for label, mruns in runs[runs["label"] != baseline].groupby("label", sort=True):
            fitted = fit(mruns, base, scorer, scores)
            if fitted is not None:
                rows.append(PowerRow(str(bench), str(label), fitted[1], fitted[0]))
    return rows


def sweep_power(sweep_dir: str | Path, scorer: str = VERDICT_SCORER,
                baseline: str = BASELINE_METHOD) -> list[PowerRow]:
    """`power_rows` of a finished sweep directory, or of a snapshot (docs/runs/<name>)."""
    eval_df, scores, _ = read_sweep_or_published(sweep_dir)
    if eval_df.empty or scorer not in set(eval_df["scorer"]):
        raise ValueError(f"--scorer {scorer!r}: no evaluations of it under {sweep_dir}")
    return power_rows(per_run_last_best(eval_df, scorer), scores, scorer, baseline)


@dataclass(frozen=True)
class Detectable:
    """The verdict's sentence for one benchmark: the smallest and largest MDD over its
    methods, or NaN with why there is none ("one seed" or "no variation"); `upper`: the
    largest 95% upper end of those MDDs, `df`: the fewest degrees of freedom (S - 1) their
    variances rest on."""

    low: float
    high: float
    why: str = ""
    upper: float = math.nan
    df: int = 0


def detectable_by_benchmark(rows: list[PowerRow]) -> dict[str, Detectable]:
    """benchmark -> its Detectable over the methods compared with the baseline."""
    out: dict[str, Detectable] = {}
    for bench in sorted({r.benchmark for r in rows}):
        fitted = [r for r in rows if r.benchmark == bench and not math.isnan(r.mdd)]
        mdds = [r.mdd for r in fitted]
        if mdds:
            out[bench] = Detectable(min(mdds), max(mdds), upper=max(r.mdd_interval[1]
                                                                    for r in fitted),
                                    df=min(r.design.seeds for r in fitted) - 1)
        elif all(r.design.seeds < 2 for r in rows if r.benchmark == bench):
            out[bench] = Detectable(math.nan, math.nan, "one seed")
        else:
            out[bench] = Detectable(math.nan, math.nan, "no variation")
    return out


RUN_DOMINATES = 0.5  # run share of Var(Δ_s) above which more problems cannot help much


def _pts(x: float, width: int) -> str:
    return f"{'n/a':>{width}s}" if math.isnan(x) else f"{100 * x:{width}.2f}"


def advice(r: PowerRow) -> list[str]:
    """The planner's sentences for one row: one seed; how uncertain the MDD is and the power
    it really gives; what buys power faster; a dominant run-to-run component."""
    d = r.design
    if d.seeds == 1:
        return ["one seed: the run-to-run component cannot be estimated (taken as 0) and the "
                "report gives no interval; run at least 3 seeds"]
    if not r.varies:
        return []
    lo, hi = r.mdd_interval
    sd_hi = sd_interval(delta_sd(r.components, d), d.seeds)[1]
    seeds_hi = next((str(s) for s in range(2, CAPS["seeds"] + 1) if t_mdd(sd_hi, s) <= r.mdd),
                    f"> {CAPS['seeds']}")
    said = [f"the MDD is an estimate: its sd rests on {d.seeds - 1} df, so the true MDD lies "
            f"in [{100 * lo:.2f}, {100 * hi:.2f}] (95%); over that uncertainty the point "
            f"figure gives {100 * r.power_at_mdd:.0f}% power, not 80%; if the sd is at its "
            f"upper end, 80% power at the point figure needs {seeds_hi} seeds"]
    t = trade(r.components, d)
    faster = min(("one more seed", "twice the samples"), key=t.__getitem__)
    said.append(f"one more seed: MDD {100 * t['one more seed']:.2f}; twice the samples per "
                f"problem: {100 * t['twice the samples']:.2f} (now {100 * t['now']:.2f}): "
                f"{faster} buys more")
    if r.run_share >= RUN_DOMINATES:
        said.append(f"run-to-run variance is {100 * r.run_share:.0f}% of a seed's Δ variance: "
                    f"more problems or samples cannot help much; with {d.seeds} seeds no "
                    f"benchmark, however large, detects less than {100 * r.floor:.2f} points: "
                    "add seeds")
    return said


def render(rows: list[PowerRow], delta: float | None) -> str:
    """Plain-text table in points (what the CLI prints)."""
    head = (f"{'benchmark':10s} {'method':28s} {'S':>3s} {'P':>5s} {'n':>4s} {'sd_run':>7s} "
            f"{'sd_prob':>8s} {'sd_inter':>8s} {'sd_within':>9s} {'sd_Δs':>6s} {'MDD':>6s} "
            f"{'MDD 95%':>15s} {'run%':>5s} {'floor':>6s}")
    lines = ["Minimum detectable difference of Δ vs the baseline at Last (the report's paired t "
             "over seeds, 95%, 80% power; points; sd_* = square roots of the variance "
             "components, within per sample; sd_Δs = sd of one seed's Δ; MDD 95% = the MDD's "
             "own interval, its sd estimated on S - 1 df; run% = the run-to-run share of its "
             "variance; floor = the MDD of these seeds with unlimited problems)",
             head]
    for r in rows:
        c, d = r.components, r.design
        lines.append(
            f"{r.benchmark:10s} {r.label:28s} {d.seeds:3d} {d.problems:5d} {d.samples:4d} "
            f"{_pts(math.sqrt(c.seed), 7)} {_pts(math.sqrt(c.problem), 8)} "
            f"{_pts(math.sqrt(c.interaction), 8)} {_pts(math.sqrt(c.within), 9)} "
            f"{_pts(delta_sd(c, d), 6)} {_pts(r.mdd, 6)} "
            f"{'[' + _pts(r.mdd_interval[0], 0) + ', ' + _pts(r.mdd_interval[1], 0) + ']':>15s} "
            f"{'n/a' if math.isnan(r.run_share) else f'{100 * r.run_share:.0f}':>5s} "
            f"{_pts(r.floor, 6)}")
        lines += [f"{'':10s} {line}" for line in advice(r)]
        if delta is not None:
            need = needed(c, d, delta / 100)
            said = ", ".join(f"{k} {v if v is not None else f'> {CAPS[k]} (unreachable)'}"
                             for k, v in need.items())
            lines.append(f"{'':10s} to detect {delta:g} points, with the others as run: {said}")
    if not rows:
        lines.append("(no method shares seeds and problems with the baseline)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis power", description=__doc__.split(
        "\n")[0])
    p.add_argument("--sweep-dir", required=True,
                   help="results/<sweep> (holds runs/), or a snapshot docs/runs/<name>")
    p.add_argument("--delta", type=float, default=None,
                   help="target difference in points: the seeds/samples/problems it needs")
    p.add_argument("--scorer", default=VERDICT_SCORER, help="scorer whose records are read")
    p.add_argument("--baseline", default=BASELINE_METHOD, help="label every method is paired with")
    args = p.parse_args(argv)
    if args.delta is not None and not args.delta > 0:
        print(f"error: --delta {args.delta}: must be a positive number of points",
              file=sys.stderr)
        return 2
    try:
        rows = sweep_power(args.sweep_dir, args.scorer, args.baseline)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: --sweep-dir {exc}" if isinstance(exc, FileNotFoundError)
              else f"error: {exc}", file=sys.stderr)
        return 2
    print(render(rows, args.delta))
    return 0
