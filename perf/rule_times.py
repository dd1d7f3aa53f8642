"""Where a finished sweep's wall time went, per Snakemake rule.

    python perf/rule_times.py results/<sweep>                  # reads results/<sweep>/benchmarks
    python perf/rule_times.py results/<sweep> --rules workflow/rules

Every rule of the workflow declares a `benchmark:` file (results/<sweep>/benchmarks/**.tsv);
Snakemake writes one row per job into it, column `s` holding the job's wall seconds. This
script groups those files by rule and prints, per rule: jobs, total seconds, mean seconds
and the share of the sum of all jobs' seconds; then the sweep's span from the first job's
start to the last job's end, and the sum / span ratio (how many jobs ran side by side).

Which rule wrote a file: the `rule_name` column when Snakemake ran with
`--benchmark-extended`; else the rule whose `benchmark:` path in workflow/rules/*.smk
matches the file (the most literal match wins: `eval/initial/step_0_toy.tsv` is the initial
model's evaluation, not a run called "initial"); else the file's top folder under
benchmarks/. The span uses file modification times (a job's end; its start is the end minus
`s`), so it holds for a sweep folder as written, not for a copy that reset the times.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

RULES_DIR = Path(__file__).resolve().parents[1] / "workflow" / "rules"
_RULE = re.compile(r"^[ \t]*rule\s+(\w+)\s*:", re.M)
_BENCH = re.compile(r"^\s+benchmark:\s*\n\s+(.+?)\s*$", re.M)
_WILDCARD = re.compile(r"\{\w+\}")


@dataclass(frozen=True)
class RulePattern:
    """A rule's benchmark path below benchmarks/, as a regex; `literal` ranks overlaps."""

    rule: str
    regex: re.Pattern
    literal: int


def _benchmark_path(expr: str) -> str | None:
    """The path a `benchmark:` expression names, wildcards as {name}; None if not readable.

    Two spellings: an f-string (f"{OUT}/benchmarks/train/{{run_id}}.tsv") and the layout's
    helper (str(LAYOUT.benchmark("train", "{run_id}")), which adds benchmarks/ and .tsv)."""
    try:
        node = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return None
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "str" and node.args:
        node = node.args[0]
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "\0" for v in node.values)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "benchmark"
            and all(isinstance(a, ast.Constant) for a in node.args)):
        return "benchmarks/" + "/".join(str(a.value) for a in node.args) + ".tsv"
    return None


def rule_patterns(rules_dir: Path) -> list[RulePattern]:
    """The `benchmark:` path of every rule in rules_dir/*.smk, relative to benchmarks/."""
    patterns = []
    for smk in sorted(Path(rules_dir).glob("*.smk")):
        text = smk.read_text()
        starts = [(m.start(), m.group(1)) for m in _RULE.finditer(text)] + [(len(text), "")]
        for (start, rule), (end, _) in zip(starts, starts[1:]):
            m = _BENCH.search(text, start, end)
            path = _benchmark_path(m.group(1)) if m else None
            if path is None or "benchmarks/" not in path:
                continue
            pieces = _WILDCARD.split(path.split("benchmarks/", 1)[1])
            regex = "[^/]+".join(re.escape(p) for p in pieces)
            patterns.append(RulePattern(rule, re.compile(regex), sum(map(len, pieces))))
    return patterns


def rule_of(rel: str, table: pd.DataFrame, patterns: list[RulePattern]) -> str:
    """The rule that wrote benchmarks/<rel> (see the module doc for the order of evidence)."""
    if "rule_name" in table.columns and table["rule_name"].notna().any():
        return str(table["rule_name"].dropna().iloc[0])
    hits = [p for p in patterns if p.regex.fullmatch(rel)]
    if hits:
        return max(hits, key=lambda p: p.literal).rule
    return Path(rel).parts[0].removesuffix(".tsv")


def read_jobs(sweep_dir: Path, rules_dir: Path = RULES_DIR) -> pd.DataFrame:
    """One row per job: rule, file, s (wall seconds), end (modification time, epoch s)."""
    root = Path(sweep_dir) / "benchmarks"
    files = sorted(root.rglob("*.tsv"))
    if not files:
        raise FileNotFoundError(
            f"no benchmark files under {root}; pass results/<sweep> of a finished sweep"
        )
    patterns = rule_patterns(rules_dir)
    rows = []
    for path in files:
        table = pd.read_csv(path, sep="\t")
        if "s" not in table.columns:
            raise ValueError(f"{path}: no 's' column; not a Snakemake benchmark file")
        rule = rule_of(path.relative_to(root).as_posix(), table, patterns)
        end = path.stat().st_mtime
        rows += [{"rule": rule, "file": str(path), "s": float(s), "end": end}
                 for s in table["s"]]
    return pd.DataFrame(rows)


def summarize(jobs: pd.DataFrame) -> pd.DataFrame:
    """Per rule: jobs, total_s, mean_s, share (of the summed job seconds), largest first."""
    g = jobs.groupby("rule")["s"]
    out = pd.DataFrame({"jobs": g.size(), "total_s": g.sum(), "mean_s": g.mean()})
    out["share"] = out["total_s"] / out["total_s"].sum()
    return out.sort_values(["total_s", "jobs"], ascending=False).reset_index()


def span_s(jobs: pd.DataFrame) -> float:
    """First job's start (end - s) to the last job's end, in seconds."""
    return float(jobs["end"].max() - (jobs["end"] - jobs["s"]).min())


def render(table: pd.DataFrame, span: float) -> str:
    total = table["total_s"].sum()
    lines = [f"{'rule':<20} {'jobs':>5} {'total s':>10} {'mean s':>9} {'share':>7}"]
    for r in table.itertuples():
        lines.append(f"{r.rule:<20} {r.jobs:>5} {r.total_s:>10.1f} {r.mean_s:>9.1f} "
                     f"{r.share:>7.1%}")
    lines.append(f"{'sum':<20} {table['jobs'].sum():>5} {total:>10.1f}")
    lines.append(f"span, first start to last end: {span:.1f} s "
                 f"({span / 60:.1f} min); sum / span = {total / span:.2f} jobs side by side"
                 if span > 0 else "span: not derivable (no job took time)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python perf/rule_times.py", description=__doc__.split("\n")[0])
    p.add_argument("sweep_dir", help="results/<sweep> (holds benchmarks/)")
    p.add_argument("--rules", default=str(RULES_DIR), help="folder of the workflow's *.smk")
    args = p.parse_args(argv)
    try:
        jobs = read_jobs(Path(args.sweep_dir), Path(args.rules))
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(render(summarize(jobs), span_s(jobs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
