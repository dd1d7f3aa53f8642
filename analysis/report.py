"""Build a sweep's report: tidy CSVs, Last/Best tables, curves and one `report.md`.

    python -m analysis report --sweep-dir results/<sweep> --out results/<sweep> \
        [--audit-dir DIR] [--figures-dir DIR] [--paper-setting model=Qwen3-4B,context=8k] \
        [--reference results/reference/reported_results.csv] [--smooth N] \
        [--baseline DAPO] [--verdict-scorer dapo]

report.md opens with the verdict (`analysis.verdict`): which methods the sweep separates
from the baseline on each benchmark, with the training run as the unit and Holm's
adjustment over its K comparisons, and each method's gain over the warm start.

Writes under `--out`:
  tables/runs.csv, tables/train_metrics.csv, tables/eval_metrics.csv   tidy collections
  tables/problem_scores.csv.gz      every per-problem score the intervals read (a snapshot
                                    ships it: `python -m analysis recompute` checks them)
  tables/last_best_<scorer>.{csv,md,tex}                               Table-3-style tables
      (mean ± SE [95% t interval] over seeds, Δ vs the baseline [95% paired t over seeds])
  tables/contrasts.csv                                                 an overlay's contrasts
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
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis import contrasts
from analysis.answers import form_table
from analysis.answers import markdown as forms_markdown
from analysis.atk import at_k_markdown
from analysis.categories import category_table
from analysis.categories import markdown as category_markdown
from analysis.collect import Collection, collect, collect_initial, problem_score_table
from analysis.concordance import report_lines as concordance_lines
from analysis.delta import BASELINE_METHOD, VERDICT_SCORER, DeltaOptions, Scores
from analysis.frontier import write_frontier_plots
from analysis.gaming import gaming_sentence, strict_scorer
from analysis.paper import (
    load_reference,
    paper_vs_ours,
    parse_paper_setting,
    render_paper_vs_ours_markdown,
    write_paper_vs_ours,
)
from analysis.plots import method_colors, write_plots
from analysis.power import detectable_by_benchmark, power_rows
from analysis.tables import (
    benchmark_display,
    benchmark_order,
    last_best_tables,
    per_run_last_best,
    render_markdown,
    write_last_best_tables,
)
from analysis.verdict import contrast_paragraph, verdict_paragraph
from analysis.warmstart import warm_start_gains
from common.files import write_atomic
from common.grading import SCORERS
from common.layout import SweepDir
from common.metrics import metric_meta

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
    delta: DeltaOptions = field(default_factory=DeltaOptions)
    verdict_scorer: str = VERDICT_SCORER


def check_options(
    sweep_dir: str | Path,
    out_dir: str | Path | None = None,
    *,
    audit_dir: str | Path | None = None,
    figures_dir: str | Path | None = None,
    paper_setting: str | dict | None = None,
    reference: str | Path | None = None,
    smooth: int = 1,
    baseline: str = BASELINE_METHOD,
    verdict_scorer: str = VERDICT_SCORER,
) -> ReportOptions:
    """Validate every input before any collection or writing; errors name the flag."""
    sweep_dir = Path(sweep_dir)
    if not SweepDir(sweep_dir).runs.is_dir():
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
        delta=DeltaOptions(baseline),
        verdict_scorer=verdict_scorer,
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
    header = ["Model", *(benchmark_display(b) for b in benches)]
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
# Report sections (each returns Markdown lines)
# ---------------------------------------------------------------------------------------


def initial_means(initial: pd.DataFrame, scorer: str) -> dict[str, float]:
    """benchmark -> the initial model's Mean@n for `scorer`; {} when it was not evaluated."""
    if initial.empty:
        return {}
    rows = initial[initial["scorer"] == scorer]
    return {str(r.benchmark): float(r.mean) for r in rows.itertuples()}


def verdict_section(tables: dict[str, pd.DataFrame], initial: pd.DataFrame,
                    scorer: str, detectable=None, gains=None) -> list[str]:
    """The first paragraph: the computed verdict for `scorer` (or the first scorer there is)."""
    if not tables:
        return ["**Verdict:** no evaluations yet, so nothing to compare.", ""]
    # a sweep that never graded the default scorer reads its first strict one; the verdict's
    # opening names the scorer it reads, which is all a reader needs
    scorer = _verdict_scorer(tables, scorer)
    # detectable: scorer -> {benchmark: (min, max) MDD}, from analysis.power
    spans = detectable(scorer) if detectable is not None else None
    # gains: scorer -> {benchmark: {label: Gain}}, paired over questions (analysis.warmstart)
    paired = gains(scorer) if gains is not None else None
    return [verdict_paragraph(tables[scorer], initial_means(initial, scorer), spans, paired),
            ""]


def _verdict_scorer(tables: dict[str, pd.DataFrame], wanted: str) -> str | None:
    """The scorer the verdict reads: `wanted`, else the first strict one evaluated (a lenient
    scorer can be gamed: common.grading), else the first evaluated (None: no table)."""
    if wanted in tables:
        return wanted
    strict = [s for s in tables if s in SCORERS and SCORERS[s].strict]
    return next(iter(strict or tables), None)


def contrasts_section(rows: pd.DataFrame | None) -> list[str]:
    """The overlay's contrasts (analysis.contrasts): their paragraph, then their table; []
    for a sweep without any (no GRPO/GRPO-ISKL pair, no staleness or lora axis)."""
    if rows is None or rows.empty:
        return []
    return [contrast_paragraph(rows), "", "## Contrasts", "",
            "The paper's contrasts inside this overlay, at Last (`python -m analysis "
            "contrasts`; paired t over seeds; * = the 95% interval excludes 0, with its "
            "Holm-adjusted p over the table's accuracy and KL comparisons; detectable = the "
            "smallest Δ this design detects at 95% with 80% power):", "",
            contrasts.markdown(rows)]


def first_paragraph(crosscheck: list[str], verdict: list[str]) -> list[str]:
    """One opening paragraph: a cross-check disagreement (or agreement) leads, the verdict
    follows, so neither is pushed below the fold."""
    return [" ".join([line for line in crosscheck if line] + [verdict[0]]), ""]


def runs_section(col: Collection, sweep_dir: Path, tables_dir: Path, out: Path) -> list[str]:
    """How many runs were read, the run table, runs lacking evaluations, warnings."""
    n_done = int(col.runs["done"].sum()) if not col.runs.empty else 0
    n_eval = int(col.runs["has_eval"].sum()) if not col.runs.empty else 0
    md = [
        "## Runs",
        "",
        f"Sweep directory `{sweep_dir}`: {len(col.runs)} run(s) collected, "
        f"{n_done} complete (DONE), {n_eval} with evaluations. Accuracies are Mean@n "
        "(average accuracy over all n samples of every problem) in percent with two "
        "decimals; the CSV files hold fractions.",
        "",
    ]
    if col.runs.empty:
        return md + ["No readable runs were found.", ""] + _warnings(col)
    extra = [
        f"{metric_meta(m).display} ({metric_meta(m).aggregation})"
        for m in RUN_SUMMARY_METRICS
        if m in col.train.columns
    ]
    header = ["Run", "Label", "Seed", "Last step", "Done", "Evaluated steps", *extra]
    lacking = col.runs[~col.runs["has_eval"]]["run_id"].tolist()
    md += [
        _md_table(header, run_summary(col)),
        "Runs without evaluations: "
        + (", ".join(f"`{r}`" for r in lacking) if lacking else "none")
        + ".",
        "",
        f"Tidy data: [runs]({_rel(tables_dir / 'runs.csv', out)}), "
        f"[training metrics]({_rel(tables_dir / 'train_metrics.csv', out)}), "
        f"[evaluation metrics]({_rel(tables_dir / 'eval_metrics.csv', out)}).",
        "",
    ]
    return md + _warnings(col)


def _warnings(col: Collection) -> list[str]:
    if not col.warnings:
        return []
    return ["Collection warnings (these files were skipped or truncated):", "",
            *(f"- {w}" for w in col.warnings), ""]


def results_section(tables: dict[str, pd.DataFrame], files: dict[str, dict[str, Path]],
                    initial: pd.DataFrame, out: Path) -> list[str]:
    """One Last/Best table per scorer, the initial model's row under it, file links."""
    md = ["## Results: Last and Best", ""]
    if not tables:
        return md + ["No evaluation summaries yet; no tables.", ""]
    for scorer, tidy in tables.items():
        links = ", ".join(f"[{ext.upper()}]({_rel(p, out)})" for ext, p in files[scorer].items())
        md += [f"### Scorer `{scorer}`", "", render_markdown(tidy),
               *initial_rows(initial, scorer), f"Files: {links}.", ""]
    return md


def answer_forms_section(col: Collection, opts: ReportOptions, tables_dir: Path) -> list[str]:
    """What the answers look like (analysis.answers), for benchmarks with number answers,
    when a strict and a lenient scorer both graded them; writes tables/answer_forms.csv."""
    if col.eval.empty or col.runs.empty:
        return []
    strict = strict_scorer(col.eval, opts.verdict_scorer)
    lenient = next((s for s in sorted(set(col.eval["scorer"]))
                    if s in SCORERS and not SCORERS[s].strict), None)
    if strict is None or lenient is None:
        return []
    table = form_table(col.runs, SweepDir(opts.sweep_dir).initial.root, strict, lenient)
    if table.empty:
        return []
    table.to_csv(tables_dir / "answer_forms.csv", index=False)
    return ["## Answer forms", "", forms_markdown(table, strict, lenient)]


def at_k_section(block: str) -> list[str]:
    """pass@k and maj@k beside Mean@n at Last (analysis.atk); [] without them."""
    if not block:
        return []
    return ["## pass@k and maj@k at Last", "",
            "What a gain is made of: Mean@n rising while pass@k stays is sharpening (surer on "
            "questions it could already solve); pass@k rising is questions solved from zero.",
            "", block.rstrip("\n"), ""]


def categories_section(blocks: list[str]) -> list[str]:
    """Accuracy by category (analysis.categories); [] when no benchmark has categories."""
    if not blocks:
        return []
    return ["## Accuracy by category", "", *(line for b in blocks for line in (b.rstrip("\n"), ""))]


def curves_section(plot_files: dict[str, list[Path]], out: Path) -> list[str]:
    md = ["## Curves", ""]
    if not plot_files:
        return md + ["No data to plot yet.", ""]
    for name, (png, pdf) in plot_files.items():
        md += [f"![{name}]({_rel(png, out)})", "", f"[PDF]({_rel(pdf, out)})", ""]
    return md


def frontier_section(plot_files: dict[str, list[Path]], out: Path) -> list[str]:
    """The reward-KL frontier figures (analysis/frontier.py); [] when no evaluation has a KL."""
    if not plot_files:
        return []
    md = ["## Reward-KL frontier", "",
          "Accuracy against KL(pi_ckpt || pi_init), the KL to the initial model each "
          "checkpoint paid on its own evaluation samples (k1, nats per response; "
          "docs/reports.md says how it is estimated).", ""]
    for name, (png, pdf) in plot_files.items():
        md += [f"![{name}]({_rel(png, out)})", "", f"[PDF]({_rel(pdf, out)})", ""]
    return md


def audit_section(audit_dir: Path | None, out: Path) -> list[str]:
    """The exact-gradient audit's audit.md, embedded; [] without --audit-dir."""
    if audit_dir is None:
        return []
    title = "Exact-gradient audit"
    audit = audit_dir / "audit.md"
    if not audit.is_file():
        return [f"## {title}", "", f"`{audit}` not found; run `python -m algorithms.audit` first.", ""]
    return [f"## {title}", "", embed_markdown(drop_title(audit.read_text(), title), audit_dir, out)]


def figures_section(figures_dir: Path | None, out: Path) -> list[str]:
    """The paper's Figures 2/3 reproduced (PNG inline, PDF linked); [] without --figures-dir."""
    if figures_dir is None:
        return []
    md = ["## Figures 2 and 3 (paper reproduction)", ""]
    pngs, pdfs = sorted(figures_dir.glob("*.png")), sorted(figures_dir.glob("*.pdf"))
    if not pngs and not pdfs:
        md += [f"No figures found in `{figures_dir}`.", ""]
    md += [line for p in pngs for line in (f"![{p.stem}]({_rel(p, out)})", "")]
    if pdfs:
        md += ["PDF: " + ", ".join(f"[{p.stem}]({_rel(p, out)})" for p in pdfs) + ".", ""]
    return md


# ---------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------


def write_tidy(col: Collection, tables_dir: Path) -> None:
    """tables/runs.csv, train_metrics.csv, eval_metrics.csv: the collection as read."""
    tables_dir.mkdir(parents=True, exist_ok=True)
    runs_csv = col.runs.assign(
        eval_steps=col.runs["eval_steps"].map(lambda s: " ".join(map(str, s)))
    )
    runs_csv.to_csv(tables_dir / "runs.csv", index=False)
    col.train.to_csv(tables_dir / "train_metrics.csv", index=False)
    col.eval.to_csv(tables_dir / "eval_metrics.csv", index=False)


@dataclass
class Published:
    """What a report states that its numbers decide: the Last/Best tables per scorer, the
    overlay's contrast rows, and the opening verdict (with the detectable sizes and the
    warm-start gains). `computed` builds it from the evaluation rows and per-problem scores
    alone, so the report and `python -m analysis recompute` write the same text."""

    tables: dict[str, pd.DataFrame]
    contrast_rows: pd.DataFrame | None
    verdict: list[str]
    categories: list[str]  # Markdown, one per (scorer, benchmark with categories)
    at_k: str = ""  # pass@k and maj@k beside Mean@n at Last, the verdict's scorer (analysis.atk)

    @classmethod
    def computed(cls, eval_df: pd.DataFrame, scores: Scores, initial: pd.DataFrame,
                 delta: DeltaOptions, verdict_scorer: str) -> Published:
        tables = last_best_tables(eval_df, scores=scores, delta=delta)
        scorer = _verdict_scorer(tables, verdict_scorer)
        rows = (contrasts.contrast_rows(per_run_last_best(eval_df, scorer), scores, scorer)
                if scorer else None)
        verdict = verdict_section(
            tables, initial, verdict_scorer,
            lambda scorer: detectable_by_benchmark(power_rows(
                per_run_last_best(eval_df, scorer), scores, scorer, delta.baseline)),
            lambda scorer: warm_start_gains(per_run_last_best(eval_df, scorer), scores, scorer))
        check = gaming_sentence(eval_df, initial, verdict_scorer) if tables else ""
        if check:
            verdict = [f"{verdict[0]} {check}", *verdict[1:]]
        blocks = []
        for name in tables:
            per_run = per_run_last_best(eval_df, name)
            for bench in benchmark_order(per_run["benchmark"]):
                table = category_table(per_run, scores, name, bench)
                if not table.empty:
                    blocks.append(category_markdown(table, name, bench))
        return cls(tables, rows, verdict, blocks,
                   at_k_markdown(eval_df, initial, scorer) if scorer else "")


def build_report(opts: ReportOptions, progress: bool = False) -> Path:
    """Collect the sweep, write tables and plots, then `report.md`; returns its path."""
    out = opts.out_dir
    col = collect(opts.sweep_dir, progress=progress)
    tables_dir, plots_dir = SweepDir(out).tables, SweepDir(out).plots
    write_tidy(col, tables_dir)
    score_table = problem_score_table(col.runs, initial=SweepDir(opts.sweep_dir).initial.root,
                                      progress=progress)
    # mtime 0: the same scores give the same bytes, so a regenerated snapshot diffs clean
    score_table.to_csv(SweepDir(out).problem_scores, index=False,
                       compression={"method": "gzip", "mtime": 0})
    scores = Scores(score_table)
    initial = collect_initial(opts.sweep_dir)
    initial.to_csv(SweepDir(out).initial_metrics, index=False)  # the verdict's warm start
    published = Published.computed(col.eval, scores, initial, opts.delta, opts.verdict_scorer)
    tables, contrast_rows = published.tables, published.contrast_rows
    table_files = write_last_best_tables(tables, tables_dir)
    plot_files = write_plots(col.train, col.eval, plots_dir, smooth=opts.smooth,
                             initial=initial)
    labels = set(col.train.get("label", [])) | set(col.eval.get("label", []))
    frontier_files = write_frontier_plots(col.eval, plots_dir, method_colors(labels),
                                          initial=initial)
    forms_lines = answer_forms_section(col, opts, tables_dir)
    crosscheck_head, crosscheck_section = concordance_lines(opts.sweep_dir)  # eval.crosscheck
    if contrast_rows is not None and not contrast_rows.empty:
        contrast_rows.to_csv(tables_dir / contrasts.CSV_NAME, index=False)
    md = [
        f"# Report: {opts.sweep_dir.resolve().name}",
        "",
        *first_paragraph(crosscheck_head, published.verdict),
        *contrasts_section(contrast_rows),
        *runs_section(col, opts.sweep_dir, tables_dir, out),
        *results_section(tables, table_files, initial, out),
        *categories_section(published.categories),
        *at_k_section(published.at_k),
        *forms_lines,
        "## Paper vs ours",
        "",
        *_paper_section(col, opts, tables_dir, out),
        *crosscheck_section,
        *curves_section(plot_files, out),
        *frontier_section(frontier_files, out),
        *audit_section(opts.audit_dir, out),
        *figures_section(opts.figures_dir, out),
    ]
    report = SweepDir(out).report
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
