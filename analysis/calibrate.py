"""The harness checks its own intervals: simulated sweeps, analysed by the report's own code.

    python -m analysis calibrate [--run-sd 4] [--interaction-sd 3] [--accuracy 25]
        [--problem-sd 15] [--problems 121] [--samples 4] [--seeds 3 5] [--family 3]
        [--effect 20] [--studies 1000] [--seed 0]
    python -m analysis calibrate --sweep-dir results/<sweep>|docs/runs/<name> [--benchmark toy]

Each simulated study is one sweep: a baseline and K methods (`--family`), S seeds each, on P
problems sampled n times, on the probability scale (points in the CLI, fractions inside):

    p[run, problem] = clip(q[problem] + effect + u[run] + e[run, problem], 0, 1)
    score[run, problem] = Binomial(n, p) / n

q: the problems' accuracy (shared by every method: difficulty; Beta-distributed with the
given mean and sd, or a sweep's baseline per-problem scores), u: the run's own shift (sd
`run_sd`: the run-to-run variance), e: a run x problem interaction (sd `interaction_sd`).
With `--sweep-dir` (a sweep, or a snapshot under docs/runs/) the sds come from its fitted
variance components (`analysis.power`, pooled over its comparisons with the baseline: u and
e carry half of the paired difference's seed and interaction components each).

Every study is written in the collector's format (evaluation rows and per-problem scores)
and read by the code every report runs: `analysis.tables.last_best_table` (the paired t over
seeds, Holm over the K Last comparisons) and `analysis.verdict.reading` (finding,
unadjusted, tie). For each number of seeds it prints, from `studies` studies:
- false separations under the null (every effect 0): the share of the K comparisons whose
  95% interval excludes 0 (expected 5%), and the share of studies with any finding, the
  family-wise rate Holm controls (at most 5%), each with its 95% Wilson interval;
- the planner's detectable Δ for this design (`analysis.power.mdd`, from the components of a
  large pilot of the same model showing that Δ) and how often a comparison with that effect
  separates: about 80% when the planner is calibrated;
- how often a comparison with `--effect` separates: a large real effect must still show.

An effect is injected as the shift whose expected gain, averaged over the problems after the
clip, is the stated size (`Model.shift_for`): a plain shift of that size gains less on
problems near 0 or 1, which would test a smaller effect than the planner's.

It exits 1 when a false-separation rate's interval lies wholly above 5%: the report's
intervals would then separate more null comparisons than they claim (the old bootstrap over
(problem, seed) pairs does: 37-46%). It also exits 1 when the power at the planner's
detectable Δ lies wholly outside 80% +- 5 points (its Wilson interval): the seeds
`python -m analysis power` asks for would then not deliver the power it promises.
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats as _scipy_stats

from analysis import power
from analysis.delta import BASELINE_METHOD, VERDICT_SCORER, DeltaOptions, Scores
from analysis.snapshot import read_sweep_or_published
from analysis.stats import LEVEL
from analysis.tables import last_best_table, per_run_last_best
from analysis.verdict import reading

NOMINAL = 1 - LEVEL  # the false-separation rate a calibrated 95% interval allows
TARGET_POWER = power.POWER  # what the planner's detectable Δ promises
POWER_TOLERANCE = 0.05  # the power there may lie in 80% +- 5 points (its Wilson interval)
PILOT_SEEDS, PILOT_PROBLEMS_MIN = 400, 400  # the large pilot the planner's components come from


@dataclass(frozen=True)
class Model:
    """The simulated world, fractions: problem accuracies `q` (shared by both methods), a
    run's shift sd, a run x problem interaction sd, and n samples per problem."""

    q: np.ndarray
    run_sd: float
    interaction_sd: float
    samples: int

    def __post_init__(self) -> None:
        if self.samples < 2:
            raise ValueError(f"--samples must be >= 2, got {self.samples}")
        for name in ("run_sd", "interaction_sd"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0")

    @property
    def problems(self) -> int:
        return len(self.q)

    def shift_for(self, effect: float) -> float:
        """The shift s whose expected gain, mean over the problems of E[clip(q + s + u + e)]
        - E[clip(q + u + e)], is `effect`: a shift of `effect` itself gains less, since a
        problem near 0 or 1 loses part of it to the clip (on the toy default's problems,
        most at 0, a 10.96-point shift gains about 7). Exact for normal u and e (the clip
        of a normal has a closed-form mean); solved by bisection, the gain rising in s."""
        if effect == 0:
            return 0.0
        sd = math.hypot(self.run_sd, self.interaction_sd)
        q = self.q

        def clipped_mean(m: np.ndarray) -> np.ndarray:  # E[clip(m + z, 0, 1)], z ~ N(0, sd^2)
            if sd == 0:
                return np.clip(m, 0.0, 1.0)
            norm = _scipy_stats.norm

            def above(x):  # E[max(x + z, 0)]
                return x * norm.cdf(x / sd) + sd * norm.pdf(x / sd)
            return above(m) - above(m - 1.0)

        base = clipped_mean(q).mean()
        sign = 1.0 if effect > 0 else -1.0
        room = (1.0 - base) if effect > 0 else base
        if abs(effect) >= room:
            raise ValueError(f"an effect of {100 * effect:+.2f} points is more than the scale "
                             f"allows: the problems' mean accuracy is {100 * base:.2f}")
        low, high = 0.0, 1.0 + 4 * sd
        for _ in range(60):
            mid = (low + high) / 2
            gain = sign * (clipped_mean(q + sign * mid).mean() - base)
            low, high = (mid, high) if gain < abs(effect) else (low, mid)
        return sign * (low + high) / 2

    def draw(self, rng: np.random.Generator, studies: int, seeds: int,
             effect: float = 0.0, problems: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
        """(method, baseline) per-problem scores, each (studies, seeds, P); the method's
        expected gain over the baseline is `effect` (`shift_for`)."""
        q = self.q if problems is None else problems
        effect = Model(q, self.run_sd, self.interaction_sd, self.samples).shift_for(effect)

        def side(shift: float) -> np.ndarray:
            u = rng.normal(0.0, self.run_sd, (studies, seeds, 1))
            e = rng.normal(0.0, self.interaction_sd, (studies, seeds, len(q)))
            p = np.clip(q + shift + u + e, 0.0, 1.0)
            return rng.binomial(self.samples, p) / self.samples

        return side(effect), side(0.0)

    def sweeps(self, rng: np.random.Generator, studies: int, family: int, seeds: int,
               effect: float = 0.0) -> np.ndarray:
        """(studies, 1 + family, seeds, P) per-problem scores: the baseline, then `family`
        methods each gaining `effect` in expectation (`shift_for`), every run with its own
        u and e."""
        shift = np.r_[0.0, np.full(family, self.shift_for(effect))][None, :, None, None]
        u = rng.normal(0.0, self.run_sd, (studies, family + 1, seeds, 1))
        e = rng.normal(0.0, self.interaction_sd, (studies, family + 1, seeds, self.problems))
        p = np.clip(self.q + shift + u + e, 0.0, 1.0)
        return rng.binomial(self.samples, p) / self.samples


def beta_accuracies(mean: float, sd: float, problems: int, seed: int = 0) -> np.ndarray:
    """P problem accuracies from the Beta distribution with this mean and sd (fractions)."""
    if not 0 < mean < 1 or not 0 < sd ** 2 < mean * (1 - mean):
        raise ValueError(f"--accuracy {100 * mean:g} and --problem-sd {100 * sd:g} points: a "
                         "Beta needs 0 < accuracy < 100 and sd^2 < accuracy (100 - accuracy)")
    k = mean * (1 - mean) / sd ** 2 - 1
    return np.random.default_rng(seed).beta(mean * k, (1 - mean) * k, problems)


def rate(hits: int, total: int) -> tuple[float, float, float]:
    """(share, low, high): the share and its 95% Wilson interval."""
    ci = _scipy_stats.binomtest(hits, total).proportion_ci(0.95, method="wilson")
    return hits / total, float(ci.low), float(ci.high)


BASELINE, BENCHMARK, SCORER = "BASE", "sim", "sim"


def study_tables(scores: np.ndarray, samples: int) -> tuple[pd.DataFrame, Scores]:
    """One simulated sweep in the collector's format: `scores` (methods, seeds, P) Mean@n,
    method 0 the baseline. (evaluation rows, per-problem scores) as a report reads them."""
    methods, seeds, problems = scores.shape
    labels = [BASELINE] + [f"M{i}" for i in range(1, methods)]
    runs = [(f"{lab}_s{s}", lab, s) for lab in labels for s in range(seeds)]
    evals = pd.DataFrame({"run_id": [r for r, _, _ in runs], "label": [lab for _, lab, _ in runs],
                          "seed": [s for _, _, s in runs], "step": 1, "benchmark": BENCHMARK,
                          "scorer": SCORER, "n": samples,
                          "mean": scores.reshape(methods * seeds, problems).mean(axis=1)})
    correct = np.rint(scores * samples).astype(int).reshape(-1)
    table = pd.DataFrame({"run_id": np.repeat(evals["run_id"].to_numpy(), problems),
                          "step": 1, "benchmark": BENCHMARK, "scorer": SCORER,
                          "problem_id": np.tile([str(p) for p in range(problems)],
                                                methods * seeds),
                          "correct": correct, "samples": samples})
    return evals, Scores(table)


def readings(scores: np.ndarray, samples: int) -> list[str]:
    """The verdict's reading of each of the K comparisons of one simulated sweep, through
    the report's table (paired t over seeds, Holm over the K Last Δs)."""
    evals, table = study_tables(scores, samples)
    tidy = last_best_table(evals, SCORER, scores=table, delta=DeltaOptions(BASELINE))
    last = tidy[(tidy["stat"] == "last") & (tidy["label"] != BASELINE)]
    return [reading(r.delta_low, r.delta_high, r.delta_p_holm) for r in last.itertuples()]


@dataclass(frozen=True)
class Counts:
    """Over a batch of studies: comparisons, those whose interval excludes 0, studies, and
    studies with at least one finding (Holm p < 0.05 and the interval excludes 0)."""

    comparisons: int
    separated: int
    studies: int
    with_finding: int


def count(batch: np.ndarray, samples: int) -> Counts:
    """`readings` over a batch (studies, methods, seeds, P)."""
    separated = comparisons = with_finding = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy's precision warning on near-equal Δ_s
        for study in batch:
            said = readings(study, samples)
            comparisons += len(said)
            separated += sum(r in ("finding", "unadjusted") for r in said)
            with_finding += "finding" in said
    return Counts(comparisons, separated, len(batch), with_finding)


def planner_components(model: Model, rng: np.random.Generator,
                       effect: float = 0.0) -> power.Components:
    """What `analysis.power.estimate` finds from a large pilot of this model with this
    effect (many seeds, the model's problems repeated): the components the planner's
    detectable Δ uses."""
    reps = max(1, math.ceil(PILOT_PROBLEMS_MIN / model.problems))
    m, b = model.draw(rng, 1, PILOT_SEEDS, effect=effect, problems=np.tile(model.q, reps))
    return power.estimate(m[0], b[0], model.samples)


def planner_mdd(model: Model, seeds: int, rng: np.random.Generator) -> float:
    """The planner's detectable Δ for this design, from a pilot that shows that Δ: a
    method that gains moves its problems' binomial variance, so the components are read
    where the MDD sits (two fixed-point steps from a null pilot)."""
    design = power.Design(seeds, model.problems, model.samples)
    delta = 0.0
    for _ in range(3):
        delta = power.mdd(planner_components(model, rng, delta), design)
    return delta


@dataclass(frozen=True)
class Row:
    seeds: int
    null: Counts
    mdd: float
    at_mdd: Counts
    effect: float
    at_effect: Counts

    @property
    def false_rate(self) -> tuple[float, float, float]:
        """Null comparisons whose interval excludes 0, with its Wilson interval."""
        return rate(self.null.separated, self.null.comparisons)

    @property
    def familywise_rate(self) -> tuple[float, float, float]:
        """Null studies with any finding after Holm, with its Wilson interval."""
        return rate(self.null.with_finding, self.null.studies)

    @property
    def power_at_mdd(self) -> tuple[float, float, float]:
        return rate(self.at_mdd.separated, self.at_mdd.comparisons)

    @property
    def power_at_effect(self) -> tuple[float, float, float]:
        return rate(self.at_effect.separated, self.at_effect.comparisons)

    @property
    def calibrated(self) -> bool:
        """Neither false-separation rate's 95% interval lies wholly above the nominal 5%."""
        return self.false_rate[1] <= NOMINAL and self.familywise_rate[1] <= NOMINAL

    @property
    def planner_holds(self) -> bool:
        """The power at the planner's detectable Δ is 80% within the tolerance: its 95%
        Wilson interval reaches into 80% +- POWER_TOLERANCE."""
        _, low, high = self.power_at_mdd
        return (low <= TARGET_POWER + POWER_TOLERANCE
                and high >= TARGET_POWER - POWER_TOLERANCE)


@dataclass
class Calibration:
    model: Model
    family: int
    rows: list[Row] = field(default_factory=list)

    @property
    def calibrated(self) -> bool:
        return all(r.calibrated for r in self.rows)

    @property
    def planner_holds(self) -> bool:
        return all(r.planner_holds for r in self.rows)


def calibrate(model: Model, seeds=(3, 5), studies: int = 1000, effect: float = 0.20,
              family: int = 3, seed: int = 0) -> Calibration:
    """Simulate and analyse (see module doc); deterministic given `seed`."""
    if studies < 1:
        raise ValueError("--studies must be >= 1")
    if family < 1:
        raise ValueError(f"--family {family}: a report compares at least 1 method")
    rng = np.random.default_rng(seed)
    out = Calibration(model, family)
    for s in seeds:
        if s < 2:
            raise ValueError(f"--seeds {s}: an interval needs at least 2 seeds")
        mdd = planner_mdd(model, s, rng)
        out.rows.append(Row(
            seeds=s, null=count(model.sweeps(rng, studies, family, s), model.samples),
            mdd=mdd, at_mdd=count(model.sweeps(rng, studies, family, s, mdd), model.samples),
            effect=effect,
            at_effect=count(model.sweeps(rng, studies, family, s, effect), model.samples)))
    return out


def _pct(r: tuple[float, float, float]) -> str:
    return f"{100 * r[0]:5.1f}% [{100 * r[1]:.1f}, {100 * r[2]:.1f}]"


def render(cal: Calibration) -> str:
    m = cal.model
    lines = [
        "Calibration of the report's Δ intervals (last_best_table: paired t over seeds, 95%, "
        f"Holm over the K = {cal.family} Last comparisons; verdict.reading) on simulated "
        "sweeps of a baseline and K methods:",
        f"  model: run-to-run sd {100 * m.run_sd:.2f} points per run, run x problem sd "
        f"{100 * m.interaction_sd:.2f}, {m.problems} problems (accuracy mean "
        f"{100 * m.q.mean():.1f}, sd {100 * m.q.std():.1f}), Mean@{m.samples}",
        "",
        f"{'seeds':>5s}  {'false separations':22s}  {'studies with a finding':22s}  "
        f"{'detectable':>10s}  {'power there':22s}  {'power at effect':26s}",
    ]
    for r in cal.rows:
        lines.append(
            f"{r.seeds:5d}  {_pct(r.false_rate):22s}  {_pct(r.familywise_rate):22s}  "
            f"{100 * r.mdd:10.2f}  {_pct(r.power_at_mdd):22s}  "
            f"{_pct(r.power_at_effect)} at {100 * r.effect:+.2f}")
    studies = cal.rows[0].null.studies if cal.rows else 0
    lines += ["", f"false separations: share of the {studies} x {cal.family} null comparisons "
              "(no effect) whose 95% interval excludes 0, with its 95% Wilson interval; "
              "expected 5%. studies with a finding: share of null studies where Holm lets "
              "any comparison through; at most 5%. detectable: the planner's smallest Δ at "
              "95% / 80% power for this design (points); power there: expected 80%. Effects "
              "are injected so that their mean over the problems, after the clip to 0-100, "
              "is the stated size.",
              "calibrated: no false-separation interval lies wholly above 5%" if cal.calibrated
              else "NOT CALIBRATED: a false-separation interval lies wholly above 5% (exit 1)",
              f"planner: the power at its detectable Δ is within {100 * TARGET_POWER:.0f}% +- "
              f"{100 * POWER_TOLERANCE:.0f} points" if cal.planner_holds else
              f"PLANNER OFF: a power at its detectable Δ lies wholly outside "
              f"{100 * TARGET_POWER:.0f}% +- {100 * POWER_TOLERANCE:.0f} points (exit 1)"]
    return "\n".join(lines)


def sweep_model(sweep_dir: str, scorer: str, benchmark: str, baseline: str) -> Model:
    """The model fitted to a finished sweep (see module doc)."""
    eval_df, scores, _ = read_sweep_or_published(sweep_dir)
    if eval_df.empty:
        raise ValueError(f"--sweep-dir {sweep_dir}: no evaluations yet")
    per_run = per_run_last_best(eval_df, scorer)
    per_run = per_run[per_run["benchmark"] == benchmark]
    if per_run.empty:
        raise ValueError(f"--benchmark {benchmark!r}: not evaluated in {sweep_dir}; it has "
                         f"{sorted(eval_df['benchmark'].unique())}")
    rows = power.power_rows(per_run, scores, scorer, baseline)
    rows = [r for r in rows if r.design.seeds >= 2 and r.varies]
    if not rows:
        raise ValueError(f"{sweep_dir}: no comparison with {baseline} on {benchmark} has two "
                         "seeds and varying scores to fit components from")
    seed = float(np.mean([r.components.seed for r in rows]))
    inter = float(np.mean([r.components.interaction for r in rows]))
    base = per_run[per_run["label"] == baseline]
    per_problem: dict[str, list[float]] = {}
    for r in base.itertuples():
        for pid, v in scores(r.run_id, int(r.last_step), benchmark).get(scorer, {}).items():
            per_problem.setdefault(pid, []).append(v)
    q = np.array([np.mean(v) for _, v in sorted(per_problem.items())])
    return Model(q, math.sqrt(seed / 2), math.sqrt(inter / 2), int(rows[0].design.samples))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis calibrate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep-dir", default=None,
                   help="fit the model to this sweep (results/<sweep>) or snapshot "
                   "(docs/runs/<name>) instead of the sds below")
    p.add_argument("--benchmark", default="toy", help="with --sweep-dir: the benchmark to fit")
    p.add_argument("--scorer", default=VERDICT_SCORER, help="with --sweep-dir: the scorer to fit")
    p.add_argument("--baseline", default=BASELINE_METHOD,
                   help="with --sweep-dir: the baseline label")
    p.add_argument("--run-sd", type=float, default=4.0, help="a run's shift sd (points)")
    p.add_argument("--interaction-sd", type=float, default=3.0,
                   help="run x problem sd (points)")
    p.add_argument("--accuracy", type=float, default=25.0, help="mean problem accuracy (points)")
    p.add_argument("--problem-sd", type=float, default=15.0, help="sd of problem accuracies")
    p.add_argument("--problems", type=int, default=121)
    p.add_argument("--samples", type=int, default=4, help="n of Mean@n")
    p.add_argument("--seeds", type=int, nargs="+", default=[3, 5])
    p.add_argument("--effect", type=float, default=20.0, help="a real effect (points)")
    p.add_argument("--family", type=int, default=3,
                   help="K: methods compared with the baseline in each simulated sweep")
    p.add_argument("--studies", type=int, default=1000, help="simulated sweeps per row")
    p.add_argument("--seed", type=int, default=0, help="the simulation's numpy seed")
    args = p.parse_args(argv)
    try:
        if args.sweep_dir:
            model = sweep_model(args.sweep_dir, args.scorer, args.benchmark, args.baseline)
        else:
            if args.problems < 2:
                raise ValueError(f"--problems must be >= 2, got {args.problems}")
            q = beta_accuracies(args.accuracy / 100, args.problem_sd / 100, args.problems,
                                args.seed)
            model = Model(q, args.run_sd / 100, args.interaction_sd / 100, args.samples)
        cal = calibrate(model, tuple(args.seeds), args.studies, args.effect / 100,
                        args.family, seed=args.seed)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(render(cal))
    return 0 if cal.calibrated and cal.planner_holds else 1
