"""Command line of the analysis package.

    python -m analysis report --sweep-dir results/<sweep> [--out results/<sweep>]
        [--audit-dir DIR] [--figures-dir DIR] [--paper-setting model=Qwen3-4B,context=8k]
        [--reference CSV] [--smooth N] [--baseline DAPO] [--verdict-scorer dapo] [--quiet]
    python -m analysis figures ...      # the paper's Figures 2/3 (analysis.figures)
    python -m analysis power --sweep-dir results/<sweep> [--delta POINTS]   # analysis.power
    python -m analysis within --sweep-dir results/<sweep> --reference stale0  # analysis.within
    python -m analysis contrasts --sweep-dir results/<sweep> [--delta 3 --kl-delta 0.2]
        # the paper's contrasts in an overlay: accuracy and KL, separation, detectable Δ
    python -m analysis calibrate [--sweep-dir results/<sweep>] [--run-sd 4 ...]
        # the harness checks its own intervals on simulated studies (analysis.calibrate)
    python -m analysis recompute docs/runs/<name>   # a snapshot's numbers from what it ships

`report` is the one call the workflow's aggregate rule makes; see analysis/report.py for
everything it writes. `figures` forwards the rest of the command line untouched.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

from analysis.delta import BASELINE_METHOD, VERDICT_SCORER


def _report_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m analysis report",
        description="Collect a sweep and write tables, plots and report.md.",
    )
    p.add_argument("--sweep-dir", required=True, help="results/<sweep> (holds runs/)")
    p.add_argument("--out", default=None, help="output folder (default: the sweep dir)")
    p.add_argument("--audit-dir", default=None, help="folder with audit.md to embed")
    p.add_argument("--figures-dir", default=None, help="folder with Figure 2/3 PNG/PDF files")
    p.add_argument(
        "--paper-setting",
        default=None,
        help="paper setting to compare with, e.g. model=Qwen3-4B,context=8k[,table=3]",
    )
    p.add_argument(
        "--reference",
        default=None,
        help="paper numbers CSV (default: results/reference/reported_results.csv)",
    )
    p.add_argument(
        "--smooth",
        type=int,
        default=1,
        help="rolling mean window (logged steps) for training curves; 1 = raw",
    )
    p.add_argument(
        "--baseline",
        default=BASELINE_METHOD,
        help="label every method is compared with in the Δ column and the verdict",
    )
    p.add_argument(
        "--verdict-scorer",
        default=VERDICT_SCORER,
        help="scorer whose table the verdict paragraph reads",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar or warning echo")
    return p


def _report(argv: list[str]) -> int:
    from analysis.report import build_report, check_options

    args = _report_parser().parse_args(argv)
    try:
        opts = check_options(
            args.sweep_dir,
            args.out,
            audit_dir=args.audit_dir,
            figures_dir=args.figures_dir,
            paper_setting=args.paper_setting,
            reference=args.reference,
            smooth=args.smooth,
            baseline=args.baseline,
            verdict_scorer=args.verdict_scorer,
        )
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with warnings.catch_warnings():
        if args.quiet:
            warnings.simplefilter("ignore")
        try:
            path = build_report(opts, progress=not args.quiet)
        except ValueError as exc:  # e.g. two runs sharing label and seed
            print(f"error: {exc}", file=sys.stderr)
            return 2
    print(f"wrote {path}")
    return 0


COMMANDS = {  # name -> (what it does, the module whose main() runs it; None: report)
    "report": ("tables, plots and report.md of a sweep", None),
    "figures": ("the paper's Figures 2/3 (analysis.figures)", "figures"),
    "power": ("variance components, detectable difference, design for --delta", "power"),
    "within": ("Δ of each overlay cell vs the same method at an axis's reference level",
               "within"),
    "contrasts": ("GRPO vs GRPO-ISKL, staleK vs stale0, LoRA vs full: accuracy and KL Δ, "
                  "detectable sizes", "contrasts"),
    "calibrate": ("simulated studies through the report's Δ interval: false separations, "
                  "power", "calibrate"),
    "recompute": ("a snapshot's tables from its shipped scores, compared with the published",
                  "recompute"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python -m analysis {{{','.join(COMMANDS)}}} ...\n")
        for name, (desc, _) in COMMANDS.items():
            print(f"  {name:9s} {desc}")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: unknown command {command!r}; choose one of {sorted(COMMANDS)}",
              file=sys.stderr)
        return 2
    module = COMMANDS[command][1]
    if module is None:
        return _report(rest)
    # lazy: each command imports only what it runs
    return importlib.import_module(f"analysis.{module}").main(rest)


if __name__ == "__main__":
    from common.console import line_buffered_stdout, quick_teardown

    quick_teardown()  # registered first: its exit handler runs last
    line_buffered_stdout()  # its log shows each line when printed
    sys.exit(main())
