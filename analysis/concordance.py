"""Concordance of our `math_verify` Mean@n with lighteval's, checkpoint by checkpoint.

    python -m analysis.concordance --sweep-dir results/<sweep>
        # writes <sweep>/crosscheck/concordance.{csv,md}; a disagreement is reported, not an error

The cross-check stage (workflow/rules/crosscheck.smk) leaves lighteval's summaries under
`<sweep>/crosscheck/lighteval/<run_id>/step_<N>/<bench>.json`, beside ours under
`<sweep>/runs/<run_id>/eval/step_<N>/<bench>.json`. Both graders run math-verify on the same
problems and prompts, but each tool draws its own samples, so the two Mean@n differ by
sampling noise alone when the tools agree.

The noise statistic: each Mean@n is the mean of P*n Bernoulli samples. Both tools draw
independently on the *same* P problems, so the between-problem spread is common to both
and cancels in the difference; what remains is the within-problem variance
sum_i p_i (1 - p_i) / (P^2 n) per tool, which is at most m (1 - m) / (P n) for a mean m
(p(1-p) is concave). The difference d = ours - lighteval is within noise when

    |d| <= z * sqrt(m1 (1 - m1) / (P n1) + m2 (1 - m2) / (P n2)),   z = 1.96 (95%),

a two-sample interval that errs on the wide side. A row outside it, or one whose tools did
not see the same problems (content hash), is a disagreement; the report names those in its
first paragraph.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from common.files import write_atomic
from common.layout import SweepDir

Z95 = 1.959963984540054  # two-sided 95% normal quantile
OURS = "math_verify"
THEIRS = "lighteval_math_verify"


def noise_halfwidth(m1: float, n1: int, m2: float, n2: int, problems: int,
                    z: float = Z95) -> float:
    """Half-width of the sampling-noise interval of m1 - m2 (see the module docstring)."""
    if problems < 1 or n1 < 1 or n2 < 1:
        raise ValueError(f"problems={problems}, n1={n1}, n2={n2}: each must be >= 1")
    var = m1 * (1 - m1) / (problems * n1) + m2 * (1 - m2) / (problems * n2)
    return z * math.sqrt(max(var, 0.0))


@dataclass(frozen=True)
class Row:
    """One (method, benchmark, checkpoint) of the concordance table; means are fractions."""

    method: str
    run_id: str
    benchmark: str
    step: int
    problems: int
    ours_mean: float
    ours_low: float | None  # our bootstrap 95% interval over problems
    ours_high: float | None
    ours_n: int
    lighteval_mean: float
    lighteval_low: float | None  # lighteval's mean +- 1.96 of its stderr
    lighteval_high: float | None
    lighteval_n: int
    diff: float  # ours - lighteval
    noise: float  # half-width of the difference's sampling-noise interval
    same_problems: bool

    @property
    def agrees(self) -> bool:
        return self.same_problems and abs(self.diff) <= self.noise


def compare(ours: dict, theirs: dict, method: str, run_id: str) -> Row:
    """The concordance row of our summary and lighteval's (both in our summary schema)."""
    mine, other = ours["scorers"][OURS], theirs["scorers"][THEIRS]
    n1, n2 = int(ours["sampling"]["n"]), int(theirs["sampling"]["n"])
    problems = int(ours["num_problems"])
    same = (theirs.get("num_problems") == problems
            and (theirs.get("source") or {}).get("sha256") == ours["source"]["sha256"])
    m1, m2 = float(mine["mean"]), float(other["mean"])
    stderr = other.get("mean_stderr")
    return Row(
        method=method, run_id=run_id, benchmark=ours["benchmark"], step=int(ours["step"]),
        problems=problems,
        ours_mean=m1, ours_low=mine.get("mean_ci95_low"), ours_high=mine.get("mean_ci95_high"),
        ours_n=n1,
        lighteval_mean=m2,
        lighteval_low=None if stderr is None else m2 - Z95 * stderr,
        lighteval_high=None if stderr is None else m2 + Z95 * stderr,
        lighteval_n=n2,
        diff=m1 - m2, noise=noise_halfwidth(m1, n1, m2, n2, problems), same_problems=same,
    )


def _method(sweep_dir: Path, run_id: str) -> str:
    config = SweepDir(sweep_dir).run(run_id).config
    if config.is_file():
        return str((yaml.safe_load(config.read_text()) or {}).get("label") or run_id)
    return run_id


def collect_rows(sweep_dir: str | Path) -> list[Row]:
    """Every lighteval summary of the sweep beside our summary of the same checkpoint."""
    sweep = SweepDir(sweep_dir)
    rows = []
    for run_id, step, bench, theirs_path in sweep.crosscheck.summaries():
        ours_path = sweep.run(run_id).eval_summary(step, bench)
        if not ours_path.is_file():
            raise FileNotFoundError(f"{theirs_path} has no counterpart {ours_path}; run rule "
                                    "evaluate for it (the workflow does)")
        ours, theirs = (json.loads(p.read_text()) for p in (ours_path, theirs_path))
        if OURS not in ours["scorers"]:
            raise ValueError(f"{ours_path}: no {OURS} scorer; add it to eval.scorers")
        rows.append(compare(ours, theirs, _method(sweep.root, run_id), run_id))
    return sorted(rows, key=lambda r: (r.benchmark, r.method, r.run_id, r.step))


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}"


def _interval(mean: float, low: float | None, high: float | None) -> str:
    return _pct(mean) if low is None else f"{_pct(mean)} [{_pct(low)}, {_pct(high)}]"


def render_markdown(rows: list[Row]) -> str:
    """The concordance table, accuracies in percent."""
    lines = [
        "| Method | Run | Benchmark | Step | P | ours Mean@n [95% CI] | lighteval Mean@n [95% CI] "
        "| Difference | Noise (±) | Verdict |",
        "|---|---|---|---:|---:|---|---|---:|---:|---|",
    ]
    for r in rows:
        verdict = ("agree" if r.agrees else "**different problems**" if not r.same_problems
                   else "**DISAGREE**")
        lines.append(
            f"| {r.method} | `{r.run_id}` | {r.benchmark} | {r.step} | {r.problems} "
            f"| {_interval(r.ours_mean, r.ours_low, r.ours_high)} (n={r.ours_n}) "
            f"| {_interval(r.lighteval_mean, r.lighteval_low, r.lighteval_high)} "
            f"(n={r.lighteval_n}) | {100 * r.diff:+.2f} | {100 * r.noise:.2f} | {verdict} |")
    return "\n".join(lines) + "\n"


def headline(rows: list[Row]) -> list[str]:
    """The report's first-paragraph lines about the cross-check (empty without one)."""
    if not rows:
        return []
    bad = [r for r in rows if not r.agrees]
    if not bad:
        return [f"Cross-check: lighteval agrees with our math_verify Mean@n within sampling "
                f"noise on all {len(rows)} checkpoint x benchmark pairs (see Concordance).", ""]
    names = ", ".join(f"{r.method} ({r.run_id}) {r.benchmark} step {r.step} ({100 * r.diff:+.2f} pts, "
                      f"noise ±{100 * r.noise:.2f})" for r in bad)
    return [f"**Cross-check disagreement**: lighteval and our math_verify Mean@n differ "
            f"beyond sampling noise on {len(bad)} of {len(rows)} pairs: {names}. Treat those "
            "numbers as unverified (see Concordance).", ""]


def report_lines(sweep_dir: str | Path) -> tuple[list[str], list[str]]:
    """(first-paragraph lines, "## Concordance" section) for analysis/report.py; both
    empty when the sweep has no cross-check."""
    rows = collect_rows(sweep_dir)
    if not rows:
        return [], []
    section = ["## Concordance with lighteval", "",
               "Our math_verify Mean@n beside lighteval's on the same checkpoint, problems, "
               "prompts and sampling settings; each tool samples independently. Noise: the "
               "95% half-width of the difference from sampling alone (analysis/concordance.py).",
               "", render_markdown(rows)]
    return headline(rows), section


def write(sweep_dir: str | Path) -> list[Row]:
    """Write <sweep>/crosscheck/concordance.{csv,md}; returns the rows."""
    import pandas as pd

    rows = collect_rows(sweep_dir)
    out = SweepDir(sweep_dir).crosscheck
    frame = pd.DataFrame([{**asdict(r), "agrees": r.agrees} for r in rows])
    write_atomic(out.concordance_csv, frame.to_csv(index=False))
    text = "# Concordance with lighteval\n\n" + "\n".join(headline(rows)) + "\n"
    write_atomic(out.concordance_md, text + render_markdown(rows))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.concordance", description=__doc__)
    p.add_argument("--sweep-dir", required=True)
    args = p.parse_args(argv)
    try:
        rows = write(args.sweep_dir)
    except (FileNotFoundError, ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not rows:
        print(f"error: no lighteval summaries under {SweepDir(args.sweep_dir).crosscheck.lighteval}",
              file=sys.stderr)
        return 2
    print("\n".join(headline(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
