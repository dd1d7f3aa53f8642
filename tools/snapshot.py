"""Commit a finished sweep as a named snapshot: docs/runs/<name>/ (docs/reports.md).

    python tools/snapshot.py results/<sweep> docs/runs/<name> --command "snakemake -c 2 ..." \
        --commit SHA --wall-s 431 --machine idle [--cpu "AMD EPYC, 2 cores"] \
        [--aten-cpu-capability default] [--date ISO] [--load "..."] [--note "..."] \
        [--samples arithmetic]
    python tools/snapshot.py --refresh docs/runs/<name> [...]   # statistics changed, runs gone

A snapshot is what README and docs/results.md quote, and all a reader needs to recompute
them: the sweep's `report.md`, its `tables/` (every CSV, Markdown and LaTeX table, and
`problem_scores.csv.gz`, the per-problem scores every interval reads; not
`train_metrics.csv`, whose per-step rows no published number needs), its `plots/` (PNG), and
`run.json` (where, how and how long it ran: `tools/gen_docs.py` turns it into the provenance
sentence). The report is first rebuilt with this checkout's analysis (`python -m analysis
report`, as the workflow's rule calls it), so a snapshot always says what the current
statistics say of its runs; `python -m analysis recompute docs/runs/<name>` then checks it.
`--samples BENCH` also ships the per-sample records of BENCH at each run's last evaluated
step and the initial model's (`samples/<run_id>.<BENCH>.jsonl.gz`), for claims about the
answers themselves (`tools/answer_forms.py`). An existing snapshot folder is replaced whole.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common.layout import SweepDir  # noqa: E402

# per-step training rows (no published number reads them); Snakemake's marker of a
# directory output (an empty file that only dates the rule's run)
LEFT_OUT = {"train_metrics.csv", ".snakemake_timestamp"}


def cpu_name() -> str:
    """lscpu's model name, else the platform's processor string."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        name = next(line.split(":", 1)[1].strip() for line in out.splitlines()
                    if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        name = platform.processor() or "unknown CPU"
    return f"{name}, {os.cpu_count()} cores"


def rebuild_report(sweep: Path) -> None:
    """The sweep's report.md, tables and plots, from its runs, with this checkout's code,
    run as the workflow runs it: from a folder where the sweep is `results/<name>` (a link
    in a temporary folder), so the report names it so and not by this machine's path."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        rel = Path("results") / sweep.resolve().name
        (Path(tmp) / "results").mkdir()
        (Path(tmp) / rel).symlink_to(sweep.resolve())
        layout = SweepDir(rel)
        cmd = [sys.executable, "-m", "analysis", "report", "--sweep-dir", str(rel), "--out",
               str(rel), "--quiet"]
        for flag, folder in (("--audit-dir", layout.audit), ("--figures-dir", layout.paper)):
            if (Path(tmp) / folder).is_dir():
                cmd += [flag, str(folder)]
        subprocess.run(cmd, check=True, cwd=tmp, env={**os.environ, "PYTHONPATH": str(REPO)})


def snapshot(sweep: Path, dest: Path, meta: dict) -> Path:
    """Copy the report, tables and plots of `sweep` into `dest` with its run.json."""
    src = SweepDir(sweep)
    if not src.report.is_file():
        raise SystemExit(f"{src.report}: no report; run the sweep (or its report rule) first")
    if dest.exists():
        shutil.rmtree(dest)
    out = SweepDir(dest)
    out.tables.mkdir(parents=True)
    out.report.write_text(unshipped_links_dropped(src.report.read_text()))
    for path in sorted(src.tables.iterdir()):
        if path.is_file() and path.name not in LEFT_OUT:
            shutil.copy(path, out.tables / path.name)
    if src.plots.is_dir():
        out.plots.mkdir()
        for path in sorted(src.plots.glob("*.png")):
            shutil.copy(path, out.plots / path.name)
    (dest / "run.json").write_text(json.dumps(meta, indent=2) + "\n")
    return dest


def unshipped_links_dropped(report: str) -> str:
    """report.md without its links to the files a snapshot leaves out (LEFT_OUT)."""
    for name in sorted(LEFT_OUT):
        report = re.sub(rf", \[[^\]]*\]\(tables/{re.escape(name)}\)", "", report)
    return report


def refresh(dest: Path) -> list[str]:
    """Rebuild a snapshot's computed files from what it ships, for when the statistics
    change and the run folders are gone: its Last/Best tables (CSV, Markdown, LaTeX), its
    contrasts, its accuracy figures, and in report.md the verdict, the contrasts' paragraph and table and each
    scorer's table (each found by its heading and replaced whole; every other line kept).
    Returns what it rewrote; `python -m analysis recompute` then checks the result."""
    from analysis import contrasts
    from analysis.recompute import recomputed
    from analysis.report import at_k_section, categories_section
    from analysis.tables import render_markdown, write_last_best_tables
    from analysis.verdict import contrast_paragraph

    snap = SweepDir(dest)
    found = recomputed(dest)
    if found is None:
        raise SystemExit(f"{dest}: no Last/Best table to refresh")
    pub, _ = found
    write_last_best_tables(pub.tables, snap.tables)
    done = [f"tables/{t}.{{csv,md,tex}}" for t in (f"last_best_{s}" for s in pub.tables)]
    text = snap.report.read_text()
    edits = [(r"\*\*Verdict\*\*[^\n]*", pub.verdict[0], "the verdict")]
    rows = pub.contrast_rows
    if rows is not None and not rows.empty:
        rows.to_csv(snap.tables / contrasts.CSV_NAME, index=False)
        done.append(f"tables/{contrasts.CSV_NAME}")
        edits += [(r"^\*\*Contrasts\*\*[^\n]*", contrast_paragraph(rows), "the contrasts"),
                   (r"^\| Contrast \|[^\n]*\n(?:\|[^\n]*\n)*", contrasts.markdown(rows),
                    "the contrasts table")]
    for scorer, tidy in pub.tables.items():
        edits.append((rf"(?<=### Scorer `{re.escape(scorer)}`\n\n)\*Scorer [^\n]*\n\n"
                      r"(?:\|[^\n]*\n)+", render_markdown(tidy), f"the `{scorer}` table"))
    for pattern, new, what in edits:
        text, hits = re.subn(pattern, lambda _m, new=new: new, text, count=1, flags=re.M)
        if not hits:
            raise SystemExit(f"{snap.report}: {what} not found where a report puts it")
        done.append(f"report.md: {what}")
    # sections older reports lack: replaced where they are, else put where a report puts them
    for heading, lines, before in (
            ("## Accuracy by category", categories_section(pub.categories), "## Paper vs ours"),
            ("## pass@k and maj@k at Last", at_k_section(pub.at_k), "## Answer forms")):
        if lines:
            text = put_section(text, heading, "\n".join(lines), before)
            done.append(f"report.md: {heading.removeprefix('## ').lower()}")
    snap.report.write_text(unshipped_links_dropped(text))
    return done + redraw_accuracy(dest)


def redraw_accuracy(dest: Path) -> list[str]:
    """The snapshot's accuracy figures (`plots/accuracy_<scorer>.png`, those it ships)
    drawn again from its tables with this checkout's plotting; the training figure needs
    the per-step rows a snapshot does not ship, so it stays."""
    from analysis.plots import method_colors, plot_accuracy
    from analysis.snapshot import read_published

    snap = SweepDir(dest)
    eval_df, _, initial = read_published(dest)
    colors = method_colors(set(eval_df["label"]))
    done = []
    for scorer in sorted(eval_df["scorer"].unique()):
        png = snap.plots / f"accuracy_{scorer}.png"
        if png.is_file():
            plot_accuracy(eval_df, scorer, colors, initial=initial).savefig(png, dpi=150)
            done.append(f"plots/{png.name}")
    return done


def put_section(text: str, heading: str, section: str, before: str) -> str:
    """`text` with its `heading` section (up to the next "## ") replaced by `section`, or
    `section` put before the `before` heading (else before the paper's)."""
    block = section.rstrip("\n") + "\n\n"  # a blank line before the next heading
    old = re.search(rf"^{re.escape(heading)}\n.*?(?=^## )", text, flags=re.M | re.S)
    if old:
        return text[:old.start()] + block + text[old.end():]
    anchor = f"{before}\n" if f"\n{before}\n" in text else "## Paper vs ours\n"
    return text.replace(anchor, block + anchor, 1)


def copy_samples(sweep: Path, dest: Path, benchmark: str) -> list[Path]:
    """Each run's per-sample records of `benchmark` at its last evaluated step, and the
    initial model's, into dest/samples/<run_id>.<benchmark>.jsonl.gz (gzip mtime 0): what a
    reader needs to check a claim about the answers themselves (tools/answer_forms.py)."""
    src = SweepDir(sweep)
    runs = [(p.name, p / "eval") for p in sorted(src.runs.iterdir()) if (p / "eval").is_dir()]
    runs.insert(0, ("initial", src.initial.eval_dir(0).parent))
    written = []
    for name, evals in runs:
        steps = sorted((int(p.name.split("_")[1]), p) for p in evals.glob("step_*")
                       if (p / f"{benchmark}.jsonl").is_file())
        if not steps:
            continue
        out = dest / "samples" / f"{name}.{benchmark}.jsonl.gz"
        out.parent.mkdir(parents=True, exist_ok=True)
        with gzip.GzipFile(out, "wb", mtime=0) as f:
            f.write((steps[-1][1] / f"{benchmark}.jsonl").read_bytes())
        written.append(out)
    if not written:
        raise SystemExit(f"{sweep}: no evaluation of {benchmark!r} to copy")
    return written


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--refresh"]:
        if len(argv) < 2:
            raise SystemExit("usage: python tools/snapshot.py --refresh docs/runs/<name> [...]")
        for dest in argv[1:]:
            print("\n".join(f"{dest}: rewrote {what}" for what in refresh(Path(dest))))
        return 0
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep", help="results/<sweep>: a finished sweep")
    p.add_argument("dest", help="docs/runs/<name>")
    p.add_argument("--command", required=True, help="the command that ran the sweep")
    p.add_argument("--commit", required=True, help="the commit it ran at")
    p.add_argument("--wall-s", type=float, required=True, help="its wall time, seconds")
    p.add_argument("--machine", choices=("idle", "shared"), required=True,
                   help="idle: nothing else ran beside it; shared: the wall time is an upper bound")
    p.add_argument("--cpu", default=None, help="default: lscpu's model name and the cores")
    p.add_argument("--aten-cpu-capability", default=None,
                   help="ATEN_CPU_CAPABILITY it ran under (default: unset, the host's kernels)")
    p.add_argument("--date", default=None, help="when it started (ISO 8601; default: now)")
    p.add_argument("--load", default=None, help="uptime lines before and after")
    p.add_argument("--note", default=None, help="a sentence the provenance line appends")
    p.add_argument("--no-rebuild", action="store_true", help="copy the report as it is")
    p.add_argument("--samples", action="append", default=[], metavar="BENCHMARK",
                   help="also ship each run's (and the initial model's) per-sample records of "
                   "BENCHMARK at its last evaluated step, gzipped, under samples/")
    args = p.parse_args(argv)
    sweep = Path(args.sweep)
    if not SweepDir(sweep).runs.is_dir():
        raise SystemExit(f"{sweep}: no runs/ folder; give results/<sweep>")
    if not args.no_rebuild:
        rebuild_report(sweep)
    import torch

    meta = {"commit": args.commit, "cpu": args.cpu or cpu_name(), "command": args.command,
            "wall_s": args.wall_s,
            "aten_cpu_capability": args.aten_cpu_capability or
            f"unset (host kernels: torch reports {torch.backends.cpu.get_cpu_capability()})",
            "date": args.date or datetime.datetime.now(datetime.timezone.utc).strftime(
                "%Y-%m-%dT%H:%M:%SZ"),
            "machine": args.machine}
    meta.update({k: v for k, v in (("load", args.load), ("note", args.note)) if v})
    print(f"wrote {snapshot(sweep, Path(args.dest), meta)}")
    for bench in args.samples:
        print(f"wrote {len(copy_samples(sweep, Path(args.dest), bench))} sample files of {bench}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
