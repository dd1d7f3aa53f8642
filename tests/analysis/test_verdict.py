"""The verdict paragraph, computed on constructed sweeps: a clear winner (and loser), a tie."""

from __future__ import annotations

import json
import warnings

from analysis_fixtures import per_problem, summary, write_run

from analysis.power import detectable_by_benchmark, sweep_power
from analysis.report import build_report, check_options
from analysis.stats import paired_bootstrap

HEAD = (
    "**Verdict** (computed from the tables below: scorer `dapo`, Mean@4 at Last, 3 seed(s) "
    "per method; Δ = method - DAPO (percentage points) with its 95% paired bootstrap interval "
    "over (problem, seed) pairs; an interval that excludes 0 separates a method from the "
    "baseline)."
)


def _sweep(root, means: dict[str, tuple[float, float, float]], initial: float | None = None):
    """One run per (label, seed) with a single toy evaluation at step 5."""
    for label, per_seed in means.items():
        for seed, mean in enumerate(per_seed):
            write_run(root / "runs", f"{label.lower()}_s{seed}", label, seed, {},
                      evals={"toy": {5: mean}})
    if initial is not None:
        d = root / "initial" / "eval" / "step_0"
        d.mkdir(parents=True)
        (d / "toy.json").write_text(json.dumps(summary("toy", 0, initial)))
    return root


def _verdict(root) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        md = build_report(check_options(root, root / "out")).read_text()
    return md.split("\n")[2]  # the first paragraph, right under the title


def _interval(method, base) -> str:
    """The expected Δ text from the per-problem scores (pairs in seed, then problem order)."""
    m = [x for mean in method for x in per_problem(mean)]
    b = [x for mean in base for x in per_problem(mean)]
    d = paired_bootstrap(m, b)  # the report's defaults: 10000 resamples, seed 0
    fmt = lambda v: "0.00" if round(v * 100, 2) == 0 else f"{v * 100:+.2f}"  # noqa: E731
    return f"{fmt(d.delta)} [{fmt(d.low)}, {fmt(d.high)}]"


def _detectable(root) -> str:
    """The expected detectable-difference sentence, from analysis.power's MDD per method."""
    lo, hi = detectable_by_benchmark(sweep_power(root))["toy"]
    size = f"{100 * lo:.2f}" if round(lo, 6) == round(hi, 6) else f"{100 * lo:.2f}-{100 * hi:.2f}"
    return (" The smallest difference this design could have detected on Toy (95% interval, "
            f"80% power; `python -m analysis power`) is {size}.")


def test_a_clear_winner_and_a_clear_loser(tmp_path):
    # per problem: DAPO 0.25 = 1, .25, 0, 0, 0; WIN 0.95 = 1, 1, 1, 1, .75 (Δ +0.70 on every
    # seed); LOSE 0.05 = .25, 0, 0, 0, 0 (Δ -0.20)
    dapo, win, lose = (0.25,) * 3, (0.95,) * 3, (0.05,) * 3
    root = _sweep(tmp_path, {"DAPO": dapo, "WIN": win, "LOSE": lose}, initial=0.05)
    text = _verdict(root)
    assert text == (
        f"{HEAD} On Toy, better than DAPO: WIN ({_interval(win, dapo)}); worse than DAPO: "
        f"LOSE ({_interval(lose, dapo)}).{_detectable(root)} The warm start (the initial model, before any RL "
        "step) scores 5.00 on Toy; gain at Last over it: DAPO +20.00, LOSE 0.00, WIN +90.00."
    )
    assert _interval(win, dapo).startswith("+70.00 [+")
    assert _interval(lose, dapo).startswith("-20.00 [-")


def test_a_tie(tmp_path):
    # NOISY is above DAPO on seed 0, below on seed 1, equal on seed 2: Δ = 0, and the
    # interval straddles 0, so the verdict must say "not distinguishable"
    dapo, noisy = (0.25, 0.25, 0.25), (0.30, 0.20, 0.25)
    root = _sweep(tmp_path, {"DAPO": dapo, "NOISY": noisy})
    text = _verdict(root)
    expected = _interval(noisy, dapo)
    assert expected.startswith("0.00 [-") and ", +" in expected
    assert text == (
        f"{HEAD} On Toy, no method is distinguishable from DAPO at 95%: NOISY ({expected})."
        f"{_detectable(root)}"
    )


def test_mixed_verdict_names_each_group(tmp_path):
    dapo = (0.25,) * 3
    root = _sweep(tmp_path, {"DAPO": dapo, "WIN": (0.95,) * 3, "SAME": dapo})
    text = _verdict(root)
    assert "better than DAPO: WIN (+70.00 [" in text
    assert "; not distinguishable from DAPO at 95%: SAME (0.00 [0.00, 0.00])." in text
    assert "worse than" not in text
