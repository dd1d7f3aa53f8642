"""The harness checks its own intervals: simulated studies, analysed by the report's Δ code.

    python -m analysis calibrate [--run-sd 4] [--interaction-sd 3] [--accuracy 25]
        [--problem-sd 15] [--problems 121] [--samples 4] [--seeds 3 5] [--effect 20]
        [--studies 2000] [--seed 0]
    python -m analysis calibrate --sweep-dir results/<sweep> [--benchmark toy] [--scorer dapo]

Each simulated study is one comparison of a method with the baseline, S seeds each, on P
problems sampled n times, on the probability scale (points in the CLI, fractions inside):

    p[run, problem] = clip(q[problem] + effect + u[run] + e[run, problem], 0, 1)
    score[run, problem] = Binomial(n, p) / n

q: the problems' accuracy (shared by both methods: difficulty; Beta-distributed with the
given mean and sd, or a sweep's baseline per-problem scores), u: the run's own shift (sd
`run_sd`: the run-to-run variance), e: a run x problem interaction (sd `interaction_sd`).
With `--sweep-dir` the sds come from the sweep's fitted variance components
(`analysis.power`, pooled over its comparisons with the baseline: u and e carry half of the
paired difference's seed and interaction components each).

For each number of seeds it prints, from `studies` simulated studies:
- the false-separation rate under the null (effect 0) of the report's interval
  (`analysis.stats.seed_delta`, the code every Δ column, verdict, contrast and within table
  runs), with its 95% binomial interval: about 5% when the interval is calibrated;
- the same rate for the harness's old interval, the bootstrap over (problem, seed) pairs
  (`analysis.stats.problem_bootstrap`), on fewer studies (it is slow);
- the planner's detectable Δ for this design (`analysis.power.mdd`, from the components of a
  large pilot of the same model showing that Δ) and how often a study with that effect
  separates: about 80% when the planner is calibrated;
- how often a study with `--effect` separates: a large real effect must still show.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field

import numpy as np
from scipy import stats as _scipy_stats

from analysis import power
from analysis.collect import collect
from analysis.delta import BASELINE_METHOD, VERDICT_SCORER, Scores
from analysis.stats import problem_bootstrap, seed_delta
from analysis.tables import per_run_last_best

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

    def draw(self, rng: np.random.Generator, studies: int, seeds: int,
             effect: float = 0.0, problems: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
        """(method, baseline) per-problem scores, each (studies, seeds, P)."""
        q = self.q if problems is None else problems

        def side(shift: float) -> np.ndarray:
            u = rng.normal(0.0, self.run_sd, (studies, seeds, 1))
            e = rng.normal(0.0, self.interaction_sd, (studies, seeds, len(q)))
            p = np.clip(q + shift + u + e, 0.0, 1.0)
            return rng.binomial(self.samples, p) / self.samples

        return side(effect), side(0.0)


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


def separations(method: np.ndarray, base: np.ndarray) -> int:
    """How many of the studies the report's interval separates (excludes 0)."""
    return sum(seed_delta(list(m), list(b)).verdict != "tie" for m, b in zip(method, base))


def old_separations(method: np.ndarray, base: np.ndarray, reps: int) -> int:
    """The same count for the old bootstrap over (problem, seed) pairs."""
    hits = 0
    for i, (m, b) in enumerate(zip(method, base)):
        _, low, high = problem_bootstrap(m, b, reps=reps, seed=i)
        hits += low > 0 or high < 0
    return hits


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
    studies: int
    false_rate: tuple[float, float, float]
    old_rate: tuple[float, float, float]
    old_studies: int
    mdd: float
    power_at_mdd: tuple[float, float, float]
    effect: float
    power_at_effect: tuple[float, float, float]


@dataclass
class Calibration:
    model: Model
    rows: list[Row] = field(default_factory=list)


def calibrate(model: Model, seeds=(3, 5), studies: int = 2000, effect: float = 0.20,
              old_studies: int = 300, old_reps: int = 1000, seed: int = 0) -> Calibration:
    """Simulate and analyse (see module doc); deterministic given `seed`."""
    if studies < 1 or old_studies < 1:
        raise ValueError("--studies must be >= 1")
    rng = np.random.default_rng(seed)
    out = Calibration(model)
    for s in seeds:
        if s < 2:
            raise ValueError(f"--seeds {s}: an interval needs at least 2 seeds")
        null_m, null_b = model.draw(rng, studies, s)
        k = min(old_studies, studies)
        mdd = planner_mdd(model, s, rng)
        at_mdd = model.draw(rng, studies, s, effect=mdd)
        at_effect = model.draw(rng, studies, s, effect=effect)
        out.rows.append(Row(
            seeds=s, studies=studies,
            false_rate=rate(separations(null_m, null_b), studies),
            old_rate=rate(old_separations(null_m[:k], null_b[:k], old_reps), k), old_studies=k,
            mdd=mdd, power_at_mdd=rate(separations(*at_mdd), studies),
            effect=effect, power_at_effect=rate(separations(*at_effect), studies)))
    return out


def _pct(r: tuple[float, float, float]) -> str:
    return f"{100 * r[0]:5.1f}% [{100 * r[1]:.1f}, {100 * r[2]:.1f}]"


def render(cal: Calibration) -> str:
    m = cal.model
    lines = [
        "Calibration of the report's Δ interval (paired t over seeds, 95%) on simulated "
        "studies of one method against the baseline:",
        f"  model: run-to-run sd {100 * m.run_sd:.2f} points per run, run x problem sd "
        f"{100 * m.interaction_sd:.2f}, {m.problems} problems (accuracy mean "
        f"{100 * m.q.mean():.1f}, sd {100 * m.q.std():.1f}), Mean@{m.samples}",
        "",
        f"{'seeds':>5s}  {'false separations':22s}  {'old bootstrap':22s}  "
        f"{'detectable':>10s}  {'power there':22s}  {'power at effect':26s}",
    ]
    for r in cal.rows:
        lines.append(
            f"{r.seeds:5d}  {_pct(r.false_rate):22s}  {_pct(r.old_rate):22s}  "
            f"{100 * r.mdd:10.2f}  {_pct(r.power_at_mdd):22s}  "
            f"{_pct(r.power_at_effect)} at {100 * r.effect:+.2f}")
    studies = cal.rows[0].studies if cal.rows else 0
    old = cal.rows[0].old_studies if cal.rows else 0
    lines += ["", f"false separations: share of {studies} null studies (no effect) whose 95% "
              "interval excludes 0, with its 95% binomial interval; expected 5%. old bootstrap: "
              f"the same for the bootstrap over (problem, seed) pairs ({old} studies). "
              "detectable: the planner's smallest Δ at 95% / 80% power for this design "
              "(points); power there: expected 80%."]
    return "\n".join(lines)


def sweep_model(sweep_dir: str, scorer: str, benchmark: str, baseline: str) -> Model:
    """The model fitted to a finished sweep (see module doc)."""
    col = collect(sweep_dir)
    if col.eval.empty:
        raise ValueError(f"--sweep-dir {sweep_dir}: no evaluations yet")
    per_run = per_run_last_best(col.eval, scorer)
    per_run = per_run[per_run["benchmark"] == benchmark]
    if per_run.empty:
        raise ValueError(f"--benchmark {benchmark!r}: not evaluated in {sweep_dir}; it has "
                         f"{sorted(col.eval['benchmark'].unique())}")
    scores = Scores.from_runs(col.runs)
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
                   help="fit the model to this sweep (results/<sweep>) instead of the sds below")
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
    p.add_argument("--studies", type=int, default=2000)
    p.add_argument("--old-studies", type=int, default=300,
                   help="studies for the old bootstrap (slow)")
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
                        args.old_studies, seed=args.seed)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(render(cal))
    return 0
