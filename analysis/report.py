"""Build a sweep's report: tidy CSVs, Last/Best tables, curves and one `report.md`.

    python -m analysis report --sweep-dir results/<sweep> --out results/<sweep> \
        [--audit-dir DIR] [--figures-dir DIR] [--paper-setting model=Qwen3-4B,context=8k] \
        [--reference results/reference/reported_results.csv] [--smooth N]

Writes under `--out`:
  tables/runs.csv, tables/train_metrics.csv, tables/eval_metrics.csv   tidy collections
  tables/last_best_<scorer>.{csv,md,tex}                               Table-3-style tables
      (report.md adds the initial model's step-0 row from <sweep_dir>/initial/, if evaluated)
  tables/paper_vs_ours.{csv,md}                                        when a setting matches
  plots/accuracy_<scorer>.{png,pdf}, plots/training.{png,pdf}          curves
  report.md                                                            written last, atomically
All links in report.md are relative to it, so the folder renders in any Markdown viewer.
Bad flags (missing folders, an unknown --paper-setting key, a missing reference file) fail
before anything is read or written.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis.collect import Collection, collect, collect_initial, metric_meta
from analysis.concordance import report_lines as concordance_lines
from analysis.plots import write_plots
from analysis.tables import (
    BENCHMARK_DISPLAY,
    benchmark_order,
    last_best_table,
    load_reference,
    paper_vs_ours,
    parse_paper_setting,
    render_markdown,
    render_paper_vs_ours_markdown,
    write_last_best_tables,
    write_paper_vs_ours,
)
from eval.files import write_atomic

REFERENCE_RELPATH = Path("results/reference/reported_results.csv")
RUN_SUMMARY_METRICS = ("time_step", "nonfinite_skips", "ref_updates")


def default_reference_path() -> Path:
    """results/reference/reported_results.csv under the working directory (how Snakemake
    runs), else under the repository holding this package."""
    here = Path.cwd() / REFERENCE_RELPATH
    return here if here.is_file() else Path(__file__).resolve().parents[1] / REFERENCE_RELPATH


@dataclass
class ReportOptions:
    """Validated inputs of one report (see `build_report`)."""

    sweep_dir: Path
    out_dir: Path
    audit_dir: Path | None = None
    figures_dir: Path | None = None
    paper_setting: dict[str, str] | None = None
    reference: pd.DataFrame | None = None
    smooth: int = 1


def check_options(
    sweep_dir: str | Path,
    out_dir: str | Path | None = None,
    *,
    audit_dir: str | Path | None = None,
    figures_dir: str | Path | None = None,
    paper_setting: str | dict | None = None,
    reference: str | Path | None = None,
    smooth: int = 1,
) -> ReportOptions:
    """Validate every input before any collection or writing; errors name the flag."""
    sweep_dir = Path(sweep_dir)
    if not (sweep_dir / "runs").is_dir():
        raise FileNotFoundError(
            f"--sweep-dir {sweep_dir}: no runs/ folder inside (expected results/<sweep>)"
        )
    for flag, d in (("--audit-dir", audit_dir), ("--figures-dir", figures_dir)):
        if d is not None and not Path(d).is_dir():
            raise FileNotFoundError(f"{flag} {d} is not a directory")
    if smooth < 1:
        raise ValueError(f"--smooth must be >= 1, got {smooth}")
    setting = parse_paper_setting(paper_setting)
    ref = None
    if setting is not None:
        ref = load_reference(Path(reference) if reference else default_reference_path())
    return ReportOptions(
        sweep_dir=sweep_dir,
        out_dir=Path(out_dir) if out_dir is not None else sweep_dir,
        audit_dir=Path(audit_dir) if audit_dir is not None else None,
        figures_dir=Path(figures_dir) if figures_dir is not None else None,
        paper_setting=setting,
        reference=ref,
        smooth=smooth,
    )


# ---------------------------------------------------------------------------------------
# Markdown helpers
# ---------------------------------------------------------------------------------------


def _rel(path: Path, start: Path) -> str:
    return Path(os.path.relpath(path.resolve(), start.resolve())).as_posix()


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


_LINK = re.compile(r"(!?\[[^\]]*\])\(([^)\s]+)\)")


def embed_markdown(text: str, source_dir: Path, out_dir: Path, shift: int = 2) -> str:
    """Another Markdown file nested in the report: headings demoted by `shift` levels and
    relative links rebased so they still resolve from `out_dir`; fenced code is untouched."""

    def rebase(m: re.Match) -> str:
        target = m.group(2)
        if re.match(r"^([a-z]+:|/|#)", target):
            return m.group(0)
        return f"{m.group(1)}({_rel(source_dir / target, out_dir)})"

    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            if line.startswith("#"):
                line = "#" * shift + line
            line = _LINK.sub(rebase, line)
        out.append(line)
    return "\n".join(out) + "\n"


def drop_title(text: str, title: str) -> str:
    """`text` without a leading `# <title>` heading: a document embedded under a section of
    the same name would otherwise repeat it one level down."""
    lines = text.lstrip("\n").splitlines()
    if lines and lines[0].lstrip("#").strip() == title and lines[0].startswith("#"):
        return "\n".join(lines[1:]).lstrip("\n") + "\n"
    return text


def initial_rows(initial: pd.DataFrame, scorer: str) -> list[str]:
    """Markdown lines: the initial model's (step 0) Mean@n per benchmark for `scorer`, the
    baseline the Last/Best numbers above it gained from; [] when it was not evaluated."""
    rows = initial[initial["scorer"] == scorer] if not initial.empty else initial
    if rows.empty:
        return []
    meta = metric_meta("mean")
    benches = benchmark_order(rows["benchmark"])
    by_bench = rows.set_index("benchmark")["mean"]
    header = ["Model", *(BENCHMARK_DISPLAY.get(b, b) for b in benches)]
    cells = ["Initial model (step 0)", *(meta.format(float(by_bench[b])) for b in benches)]
    return [
        "The model every run starts from, evaluated the same way before any RL step:",
        "",
        _md_table(header, [cells]),
    ]


def run_summary(col: Collection) -> list[list[str]]:
    """Rows of the report's run table; training summaries use each metric's aggregation."""
    rows = []
    for r in col.runs.sort_values(["label", "seed", "run_id"]).itertuples():
        train = col.train[col.train["run_id"] == r.run_id]
        extra = []
        for metric in RUN_SUMMARY_METRICS:
            if metric not in col.train.columns:
                continue
            meta = metric_meta(metric)
            values = train[metric].dropna()
            if values.empty:
                extra.append("–")
                continue
            agg = {
                "mean": values.mean,
                "sum": values.sum,
                "max": values.max,
                "last": lambda v=values: v.iloc[-1],
            }[meta.aggregation]()
            extra.append(meta.format(float(agg)))
        steps = ", ".join(str(s) for s in r.eval_steps) or "none"
        last = "–" if pd.isna(r.last_step) else str(int(r.last_step))
        rows.append(
            [f"`{r.run_id}`", r.label, str(r.seed), last, "yes" if r.done else "no", steps, *extra]
        )
    return rows


# ---------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------


def build_report(opts: ReportOptions, progress: bool = False) -> Path:
    """Collect the sweep, write tables and plots, then `report.md`; returns its path."""
    out = opts.out_dir
    col = collect(opts.sweep_dir, progress=progress)
    tables_dir, plots_dir = out / "tables", out / "plots"
    tables_dir.mkdir(parents=True, exist_ok=True)
    runs_csv = col.runs.assign(
        eval_steps=col.runs["eval_steps"].map(lambda s: " ".join(map(str, s)))
    )
    runs_csv.to_csv(tables_dir / "runs.csv", index=False)
    col.train.to_csv(tables_dir / "train_metrics.csv", index=False)
    col.eval.to_csv(tables_dir / "eval_metrics.csv", index=False)
    table_files = write_last_best_tables(col.eval, tables_dir)
    initial = collect_initial(opts.sweep_dir)
    plot_files = write_plots(col.train, col.eval, plots_dir, smooth=opts.smooth)

    md: list[str] = [f"# Report: {opts.sweep_dir.resolve().name}", ""]
    crosscheck_head, crosscheck_section = concordance_lines(opts.sweep_dir)  # eval.crosscheck
    md += crosscheck_head
    n_done = int(col.runs["done"].sum()) if not col.runs.empty else 0
    n_eval = int(col.runs["has_eval"].sum()) if not col.runs.empty else 0
    md += [
        f"Sweep directory `{opts.sweep_dir}`: {len(col.runs)} run(s) collected, "
        f"{n_done} complete (DONE), {n_eval} with evaluations. Accuracies are Mean@n "
        "(average accuracy over all n samples of every problem) in percent with two "
        "decimals; the CSV files hold fractions.",
        "",
        "## Runs",
        "",
    ]
    if col.runs.empty:
        md += ["No readable runs were found.", ""]
    else:
        extra = [
            metric_meta(m).display + f" ({metric_meta(m).aggregation})"
            for m in RUN_SUMMARY_METRICS
            if m in col.train.columns
        ]
        md.append(
            _md_table(
                ["Run", "Label", "Seed", "Last step", "Done", "Evaluated steps", *extra],
                run_summary(col),
            )
        )
        lacking = col.runs[~col.runs["has_eval"]]["run_id"].tolist()
        md += [
            "Runs without evaluations: "
            + (", ".join(f"`{r}`" for r in lacking) if lacking else "none")
            + ".",
            "",
            f"Tidy data: [runs]({_rel(tables_dir / 'runs.csv', out)}), "
            f"[training metrics]({_rel(tables_dir / 'train_metrics.csv', out)}), "
            f"[evaluation metrics]({_rel(tables_dir / 'eval_metrics.csv', out)}).",
            "",
        ]
    if col.warnings:
        md += ["Collection warnings (these files were skipped or truncated):", ""]
        md += [f"- {w}" for w in col.warnings] + [""]

    md += ["## Results: Last and Best", ""]
    if not table_files:
        md += ["No evaluation summaries yet; no tables.", ""]
    for scorer, paths in table_files.items():
        md += [
            f"### Scorer `{scorer}`",
            "",
            render_markdown(last_best_table(col.eval, scorer)),
            *initial_rows(initial, scorer),
            "Files: "
            + ", ".join(f"[{ext.upper()}]({_rel(p, out)})" for ext, p in paths.items())
            + ".",
            "",
        ]

    md += ["## Paper vs ours", ""]
    md += _paper_section(col, opts, tables_dir, out)

    md += crosscheck_section
    md += ["## Curves", ""]
    if not plot_files:
        md += ["No data to plot yet.", ""]
    for name, (png, pdf) in plot_files.items():
        md += [f"![{name}]({_rel(png, out)})", "", f"[PDF]({_rel(pdf, out)})", ""]

    if opts.audit_dir is not None:
        title = "Exact-gradient audit"
        md += [f"## {title}", ""]
        audit = opts.audit_dir / "audit.md"
        if audit.is_file():
            md.append(embed_markdown(drop_title(audit.read_text(), title), opts.audit_dir, out))
        else:
            md += [f"`{audit}` not found; run `python -m algorithms.audit` first.", ""]

    if opts.figures_dir is not None:
        md += ["## Figures 2 and 3 (paper reproduction)", ""]
        pngs = sorted(opts.figures_dir.glob("*.png"))
        pdfs = sorted(opts.figures_dir.glob("*.pdf"))
        if not pngs and not pdfs:
            md += [f"No figures found in `{opts.figures_dir}`.", ""]
        for p in pngs:
            md += [f"![{p.stem}]({_rel(p, out)})", ""]
        if pdfs:
            md += ["PDF: " + ", ".join(f"[{p.stem}]({_rel(p, out)})" for p in pdfs) + ".", ""]

    report = out / "report.md"
    # atomic: report.md is the workflow's completion signal
    write_atomic(report, "\n".join(md).rstrip() + "\n")
    return report


def _paper_section(col: Collection, opts: ReportOptions, tables_dir: Path, out: Path) -> list[str]:
    if opts.paper_setting is None:
        return [
            "No paper setting declared (pass `--paper-setting model=...,context=...`"
            "[`,table=N`]); no comparison with the paper's numbers.",
            "",
        ]
    comparison = paper_vs_ours(col.eval, col.runs, opts.reference, opts.paper_setting)
    md: list[str] = []
    if comparison.table is not None:
        paths = write_paper_vs_ours(comparison, opts.paper_setting, tables_dir)
        md += [
            render_paper_vs_ours_markdown(comparison.table, opts.paper_setting),
            f"Files: [CSV]({_rel(paths['csv'], out)}), [MD]({_rel(paths['md'], out)}).",
            "",
        ]
    md += [f"- {note}" for note in comparison.notes]
    return md + [""]
