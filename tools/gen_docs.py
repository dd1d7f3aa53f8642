"""Regenerate the tables in docs/ that code can produce, or check that they are current.

    python tools/gen_docs.py            # rewrite every generated block in place
    python tools/gen_docs.py --check    # exit 1 and name each stale block (CI: tests/test_docs_generated.py)

A page marks a generated block with a pair of HTML comments, which Markdown viewers hide:

    <!-- generated:run-config -->
    ...table written by this script...
    <!-- /generated:run-config -->

The text between the markers belongs to this script; edit the code it reads instead (a
pydantic `Field(description=...)`, the metric registry, the audit). Hand-pasted tables
drift; these cannot, because the test fails when a block differs from what the code gives.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel

REPO = Path(__file__).resolve().parents[1]
PAGES = ["docs/*.md", "config/README.md", "README.md"]
BLOCK = re.compile(r"(<!-- generated:([\w-]+) -->\n)(.*?)(<!-- /generated:\2 -->)", re.S)


# ---------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------


def cell(text: str) -> str:
    """One table cell: a literal `|` would end the cell, so it is escaped."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(header: list[str], rows: list[list[str]], align: str = "") -> str:
    """A GitHub Markdown table; `align` holds one of l/r per column (default: left)."""
    align = align or "l" * len(header)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = [header, rule, *rows]
    return "".join("| " + " | ".join(cell(c) for c in line) + " |\n" for line in lines)


# ---------------------------------------------------------------------------------------
# Config models: one row per key, from the pydantic fields
# ---------------------------------------------------------------------------------------


def _docstring_fields(model: type[BaseModel]) -> dict[str, str]:
    """`name: text` entries of a model's docstring, for fields without a Field description."""
    doc = inspect.cleandoc(model.__doc__ or "")
    found: dict[str, str] = {}
    name = None
    for line in doc.splitlines():
        match = re.match(r"^(\w+): (.*)$", line)
        if match and match.group(1) in model.model_fields:
            name = match.group(1)
            found[name] = match.group(2).strip()
        elif name and line.startswith(" ") and line.strip():
            found[name] += " " + line.strip()
        else:
            name = None
    return found


def _model_in(annotation) -> type[BaseModel] | None:
    """The BaseModel class of `X` or `X | None`, else None."""
    candidates = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    for c in candidates:
        if isinstance(c, type) and issubclass(c, BaseModel):
            return c
    return None


def _list_item_model(annotation) -> type[BaseModel] | None:
    """X for `list[X]`, `list[X | None]` (and those `| None`) when X is a BaseModel."""
    candidates = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    for c in candidates:
        if typing.get_origin(c) is list:
            return _model_in(typing.get_args(c)[0])
    return None


def _is_union(annotation) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _type_text(annotation) -> str:
    """A readable type: Literal choices as code, `list of ...`, a model by its name."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "`null`"
    if origin is typing.Annotated:  # a Registry.Name: the names registered now
        names = _registry_names(annotation.__metadata__)
        return " | ".join(f"`{n}`" for n in names) if names is not None else _type_text(args[0])
    if origin is typing.Literal:
        return " | ".join(f"`{v}`" for v in args)
    if _is_union(annotation):
        return " or ".join(_type_text(a) for a in sorted(args, key=lambda a: a is type(None)))
    if origin is list:
        inner = _type_text(args[0])
        return f"list of ({inner})" if _is_union(args[0]) else f"list of {inner}"
    if origin is tuple:
        return "[" + ", ".join(_type_text(a) for a in args) + "]"
    if origin is dict:
        return f"map of {_type_text(args[0])} to {_type_text(args[1])}"
    if annotation is typing.Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def _registries() -> dict[tuple[str, str], dict]:
    """String fields validated against a registry: (model class name, field) -> registry."""
    from algorithms import ADVANTAGE_ESTIMATORS, METHODS, OBJECTIVES, REFERENCE_SCHEDULES
    from eval.benchmarks import BENCHMARKS

    return {("LossConfig", "objective"): OBJECTIVES,
            ("SweepConfig", "methods"): METHODS,
            ("EvalSpec", "benchmarks"): BENCHMARKS,
            ("ReferenceConfig", "schedule"): REFERENCE_SCHEDULES,
            ("ReferenceAxis", "schedule"): REFERENCE_SCHEDULES,
            ("MethodConfig", "name"): METHODS,
            ("MethodConfig", "advantage"): ADVANTAGE_ESTIMATORS}


def _registry_names(metadata) -> list[str] | None:
    """The names of the Registry behind a Registry.Name's metadata (None: not one)."""
    for meta in metadata:
        registry = getattr(meta, "registry", None)
        if registry is not None:
            return registry.names()
    return None


def _allowed(field, registry: dict | None = None) -> str:
    """Allowed values: the type (Literal choices spelled out) and any numeric bounds; for a
    string checked against a registry, the names registered now."""
    if registry is not None:
        names = " | ".join(f"`{n}`" for n in registry)
        optional = " or `null`" if type(None) in typing.get_args(field.annotation) else ""
        listed = "list of " if typing.get_origin(field.annotation) is list else ""
        return f"{listed}registered: {names}{optional}"
    bounds = []
    for meta in field.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(meta, attr, None)
            if value is not None:
                bounds.append(f"{sign} {value}")
    names = _registry_names(field.metadata)
    text = (" | ".join(f"`{n}`" for n in names) if names is not None
            else _type_text(field.annotation))
    return text + (" (" + ", ".join(bounds) + ")" if bounds else "")


def _default(field) -> str:
    if field.is_required():
        return "(required)"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return ""
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (tuple, list, dict)):
        return f"`{json.dumps(list(value) if isinstance(value, tuple) else value)}`"
    if value == "":
        return '`""`'
    return f"`{value}`"


def config_rows(model: type[BaseModel], prefix: str = "") -> Iterator[list[str]]:
    """[key, default, allowed, meaning] per field; a nested model gives its own rows."""
    fallback = _docstring_fields(model)
    registries = _registries()
    for name, field in model.model_fields.items():
        key = prefix + name
        meaning = field.description or fallback.get(name, "")
        sub = _model_in(field.annotation)
        if sub is not None:
            section_doc = inspect.cleandoc(sub.__doc__ or "").split("\n\n")[0].replace("\n", " ")
            default = _default(field)
            head = f"**`{key}`**" + (f" ({default.strip('()')})" if default else "")
            yield [head, "", "", meaning or section_doc]
            yield from config_rows(sub, key + ".")
        else:
            registry = registries.get((model.__name__, name))
            yield [f"`{key}`", _default(field), _allowed(field, registry), meaning]
            item = _list_item_model(field.annotation)
            if item is not None:  # e.g. the sweep's axes.clip: a list of ClipAxis settings
                yield from config_rows(item, key + "[].")


def config_table(model: type[BaseModel]) -> str:
    return markdown_table(["key", "default", "allowed", "meaning"], list(config_rows(model)))


def gen_run_config() -> str:
    from trainer.config import RunConfig

    return config_table(RunConfig)


def gen_sweep_config() -> str:
    from sweep.spec import SweepConfig

    return config_table(SweepConfig)


def gen_loss_config() -> str:
    from algorithms.config import LossConfig

    return config_table(LossConfig)


# ---------------------------------------------------------------------------------------
# The exact-gradient audit and the metric registry
# ---------------------------------------------------------------------------------------


def gen_audit() -> str:
    """The audit's summary table at its default seed and beta (what `python -m algorithms.audit` prints)."""
    import torch

    from algorithms.audit import run_audit, summary_table

    torch.set_num_threads(1)
    table = summary_table(run_audit())
    align = "".join("r" if c.startswith("KL-part var") else "l" for c in table.columns)
    return markdown_table(list(table.columns), table.astype(str).values.tolist(), align)


def gen_audit_corrections() -> str:
    """The three-policy audit of the off-policy corrections (`python -m algorithms.audit`)."""
    import torch

    from algorithms.audit import correction_table, run_correction_audit

    torch.set_num_threads(1)
    table = correction_table(run_correction_audit())
    return markdown_table(list(table.columns), table.astype(str).values.tolist(),
                          "l" * len(table.columns))


def gen_kl_certificate_peers() -> str:
    """Every registered peer setting's certificate (`python -m algorithms.certify`)."""
    import torch

    from algorithms.certify import REGIMES, describe, table_row
    from algorithms.peers import PEERS

    torch.set_num_threads(1)
    header = ["framework", "setting", "KL terms", *REGIMES]
    rows = []
    for peer in PEERS.values():
        for label, options in peer.rows:
            refusal = peer.refusal(options)
            if refusal is not None:  # the framework raises: a row that warns, no verdicts
                rows.append([peer.name, label, f"rejected: {refusal.split(': ', 1)[1]}",
                             *["rejected by the framework"] * len(REGIMES)])
                continue
            setting = peer.resolve(options)
            rows.append([peer.name, label, describe(setting), *table_row(setting)])
    text = markdown_table(header, rows)
    text += "\nTo get the reverse-KL gradient:\n\n"
    for peer in PEERS.values():
        text += (f"- **{peer.name}** ({peer.version}, commit `{peer.commit[:10]}`, read from "
                 f"{', '.join(f'`{s}`' for s in peer.sources)}): {peer.advice}\n")
    return text


def gen_kl_certificate_ingredients() -> str:
    """The certificate of every registered estimator x placement x weight."""
    import torch

    from algorithms.certify import REGIMES, describe, ingredient_settings, table_row

    torch.set_num_threads(1)
    rows = [[describe(s), *table_row(s)] for s in ingredient_settings()]
    return markdown_table(["KL term", *REGIMES], rows)


def gen_metrics() -> str:
    from common import metrics as registry

    metas = list(registry.load_metric_meta().values())
    metas += [registry.metric_meta(f"{family}_4") for family in ("pass_at", "maj_at")]
    rows = []
    better = {True: "higher", False: "lower", None: ""}
    for m in metas:
        name, display = m.name, m.display
        if re.fullmatch(r"(pass|maj)_at_4", name):
            name, display = name[:-1] + "<k>", display.replace("4", "k")
        rows.append([f"`{name}`", display, better[m.higher_is_better], m.aggregation, m.fmt,
                     m.description])
    header = ["name", "shown as", "better", "per-run summary", "format", "meaning"]
    source = f"From `{registry.__name__}.load_metric_meta()` and `metric_meta()` (families).\n\n"
    return source + markdown_table(header, rows)


def gen_sizing() -> str:
    """Per-GPU memory and step time of every shipped preset (`python -m sweep.sizing --all`)."""
    from sweep.sizing import GPUS, MEAN_RESPONSE, PRESETS, host_table, preset_row, table

    rows = [preset_row(paths, GPUS["h100"], MEAN_RESPONSE) for paths in PRESETS]
    return (table(rows, "h100", MEAN_RESPONSE).rstrip("\n") + "\n\n"
            + host_table([(name, r["host"]) for name, r in rows]).rstrip("\n") + "\n")


# ---------------------------------------------------------------------------------------
# Results of a named run: a committed snapshot of a finished sweep (docs/runs/<name>/)
# ---------------------------------------------------------------------------------------

SNAPSHOT_KEYS = ("commit", "cpu", "command", "wall_s", "aten_cpu_capability", "date")
DEFAULT_SNAPSHOT = "docs/runs/default-host"  # README's numbers: the default on the host CPU


class SourceMissing(Exception):
    """A block's source is not in the repository: the block is kept and reported, never
    passed as current."""


def snapshot_meta(folder: Path) -> dict:
    """`run.json` of a snapshot folder: where, how and how long the sweep ran."""
    path = folder / "run.json"
    if not path.is_file():
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        raise SourceMissing(f"{shown} is missing: commit the finished sweep's snapshot "
                            "(run.json, tables/, report.md; docs/reports.md)")
    meta = json.loads(path.read_text())
    missing = [k for k in SNAPSHOT_KEYS if k not in meta]
    if missing:
        raise SystemExit(f"{path}: lacks {missing}; it holds {list(SNAPSHOT_KEYS)}")
    return meta


def wall_time(seconds: float) -> str:
    """1234.5 -> '20 min 35 s'."""
    minutes, secs = divmod(round(float(seconds)), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def _load_note(meta: dict) -> str:
    """What the wall time is worth: run.json's optional `machine` says whether anything ran
    beside the sweep ("idle") or not ("shared", assumed when only `load` is recorded: a wall
    time on a shared machine is an upper bound)."""
    machine = meta.get("machine", "shared" if meta.get("load") else None)
    notes = {None: "", "idle": " (an idle machine: nothing else ran beside the sweep",
             "shared": " (an upper bound: the machine was shared with other work"}
    if machine not in notes:
        raise SystemExit(f"run.json: machine is {machine!r}; it is 'idle' (nothing else ran "
                         "beside the sweep) or 'shared'")
    if not notes[machine]:
        return ""
    return notes[machine] + ("; load averages in `run.json`)" if meta.get("load") else ")")


def _report_part(report: str, scorer: str) -> tuple[str, str]:
    """(the verdict paragraph, the initial model's table of `scorer`) of a report.md."""
    verdict = next((line for line in report.splitlines() if line.startswith("**Verdict**")), "")
    section = report.split(f"### Scorer `{scorer}`", 1)[-1].split("\n### ", 1)[0]
    initial = re.search(r"^\| Model \|.*?(?=\n\n|\Z)", section, re.S | re.M)
    return verdict, initial.group(0) + "\n" if initial else ""


def snapshot_results(folder: Path, link: str, scorer: str | None = None) -> str:
    """The named run's provenance sentence, its Last/Best table (verbatim from its
    `tables/`), the initial model's row and the report's verdict, as README shows them."""
    from analysis.delta import VERDICT_SCORER
    from analysis.tables import table_stem
    from common.layout import SweepDir

    scorer = scorer or VERDICT_SCORER
    meta = snapshot_meta(folder)
    run = SweepDir(folder)
    table_path = run.tables / f"{table_stem(scorer)}.md"
    require(table_path, run.report)
    verdict, initial = _report_part(run.report.read_text(), scorer)
    lines = [f"{provenance(meta)} Its table, verbatim from [the run's report]({link}/report.md):",
             "", table_path.read_text().rstrip("\n"), ""]
    if initial:
        lines += [initial]
    if verdict:
        lines += ["The report's first paragraph, computed from these numbers "
                  "(`analysis/verdict.py`):", "", f"> {verdict}", ""]
    return "\n".join(lines)


def require(*paths: Path) -> None:
    """Every file a README block is made from is in the snapshot, or one line says which."""
    for path in paths:
        if not path.is_file():
            raise SystemExit(f"{path}: missing from the snapshot; copy the sweep's tables/, "
                             "plots/ and report.md verbatim")


def provenance(meta: dict) -> str:
    """The sentence that says where, how and how long a snapshot's sweep ran."""
    aten = meta["aten_cpu_capability"] or "unset (the CPU's best kernels)"
    return (f"Measured: `{meta['command']}` at commit `{meta['commit']}` on {meta['date']}, "
            f"{meta['cpu']}, ATEN_CPU_CAPABILITY {aten}: **{wall_time(meta['wall_s'])}** "
            f"wall time{_load_note(meta)}." + (f" {meta['note']}" if meta.get("note") else ""))


def gen_default_results() -> str:
    return snapshot_results(REPO / DEFAULT_SNAPSHOT, DEFAULT_SNAPSHOT)


FRONTIER_SNAPSHOT = "docs/runs/frontier"  # docs/results.md's frontier: the reward-KL frontier


def gen_frontier_results() -> str:
    """The frontier overlay's snapshot as docs/results.md shows it (links relative to docs/):
    provenance, the designs' plot at Last and the report's computed contrasts paragraph
    (analysis.contrasts)."""
    from analysis.delta import VERDICT_SCORER
    from common.layout import SweepDir

    folder = REPO / FRONTIER_SNAPSHOT
    meta = snapshot_meta(folder)
    run = SweepDir(folder)
    plot = run.plots / f"frontier_designs_{VERDICT_SCORER}.png"
    require(plot, run.report)
    contrasts = next((line for line in run.report.read_text().splitlines()
                      if line.startswith("**Contrasts**")), None)
    if contrasts is None:
        raise SystemExit(f"{run.report}: no contrasts paragraph; regenerate the report with "
                         "`python -m analysis report`")
    rel = plot.relative_to(REPO / "docs")
    folder = Path(FRONTIER_SNAPSHOT).relative_to("docs")
    return "\n".join([
        f"{provenance(meta)} Each design (method x beta, fixed reference) at its Last "
        f"checkpoint, Toy accuracy against the KL it paid to the initial model, with 95% t "
        f"intervals over seeds on both axes ([the run's report]({folder}/report.md)):",
        "", f"![reward-KL frontier: designs at Last with 95% seed intervals]({rel})", "",
        "The report's contrasts, computed from these runs (`analysis/contrasts.py`):", "",
        f"> {contrasts}", ""])


REAL_CPU_SNAPSHOT = "docs/runs/real-cpu"  # config/real-cpu.yaml as it is: the strict reward
LENIENT_SNAPSHOT = "docs/runs/real-cpu-lenient"  # the 8-step run on the lenient grader, kept


def gen_real_cpu_results() -> str:
    """config/real-cpu.yaml's snapshot as docs/results.md shows it: provenance, the strict
    scorer's table, the initial model's row, the verdict (grader check included) and the
    accuracy by operation (links relative to docs/)."""
    folder = REPO / REAL_CPU_SNAPSHOT
    text = snapshot_results(folder, str(Path(REAL_CPU_SNAPSHOT).relative_to("docs")),
                            "math_verify_boxed")
    report = (folder / "report.md").read_text()
    found = re.search(r"^\*Arithmetic by category, scorer math_verify_boxed:[^\n]*\n\n"
                      r"(?:\|[^\n]*\n)+", report, flags=re.M)
    if found is None:
        raise SystemExit(f"{folder}/report.md: no accuracy by category for math_verify_boxed")
    return text + "\nBy operation, from the same report:\n\n" + found.group(0)


def gen_real_cpu_lenient_results() -> str:
    """The lenient 8-step snapshot as docs/results.md shows it: provenance, the math_verify
    table, the initial model's row and the verdict, whose grader check catches every run."""
    return snapshot_results(REPO / LENIENT_SNAPSHOT,
                            str(Path(LENIENT_SNAPSHOT).relative_to("docs")), "math_verify")


GENERATORS: dict[str, Callable[[], str]] = {
    "default-results": gen_default_results,
    "real-cpu-results": gen_real_cpu_results,
    "real-cpu-lenient-results": gen_real_cpu_lenient_results,
    "frontier-results": gen_frontier_results,
    "run-config": gen_run_config,
    "loss-config": gen_loss_config,
    "sweep-config": gen_sweep_config,
    "audit": gen_audit,
    "audit-corrections": gen_audit_corrections,
    "metrics": gen_metrics,
    "kl-certificate-peers": gen_kl_certificate_peers,
    "kl-certificate-ingredients": gen_kl_certificate_ingredients,
    "sizing": gen_sizing,
}


# ---------------------------------------------------------------------------------------
# Pages
# ---------------------------------------------------------------------------------------


def pages(repo: Path = REPO) -> list[Path]:
    return sorted({p for pattern in PAGES for p in repo.glob(pattern)})


def render(text: str, cache: dict[str, str], where: str,
           missing: dict[str, str] | None = None) -> str:
    """`text` with every generated block rewritten; an unknown block name is an error. A
    block whose source is missing (`SourceMissing`) keeps its text; `missing` gets why."""
    def replace(match: re.Match) -> str:
        name = match.group(2)
        if name not in GENERATORS:
            raise SystemExit(f"{where}: unknown generated block {name!r}; known: "
                             f"{sorted(GENERATORS)} (tools/gen_docs.py)")
        if name not in cache:
            try:
                cache[name] = GENERATORS[name]()
            except SourceMissing as exc:
                cache[name] = match.group(3)
                if missing is not None:
                    missing[name] = str(exc)
        return match.group(1) + cache[name] + match.group(4)

    return BLOCK.sub(replace, text)


def stale_blocks(repo: Path = REPO, write: bool = False) -> list[str]:
    """'page: block' for every block that differs from the code's; rewrites them if `write`.

    A generator whose block appears on no page is reported too, so deleting a marker pair
    cannot turn a generated table back into a pasted one unnoticed.
    A block whose source is missing (a run snapshot not committed yet) is reported as
    "not generated", with its text kept, so pasted numbers cannot pass as generated ones.
    """
    cache: dict[str, str] = {}
    stale, seen = [], set()
    for page in pages(repo):
        where = str(page.relative_to(repo))
        old = page.read_text()
        names = [m.group(2) for m in BLOCK.finditer(old)]
        seen.update(names)
        missing: dict[str, str] = {}
        new = render(old, cache, where, missing)
        stale += [f"{where}: {n} (not generated: {why})" for n, why in missing.items()]
        if new != old:
            old_blocks = {m.group(2): m.group(3) for m in BLOCK.finditer(old)}
            stale += [f"{where}: {n}" for n in names if cache.get(n) != old_blocks[n]]
            if write:
                page.write_text(new)
    stale += [f"(no page): {n}" for n in GENERATORS if n not in seen]
    return stale


def main(argv: list[str] | None = None, repo: Path = REPO) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only check; exit 1 naming each stale block")
    args = parser.parse_args(argv)
    stale = stale_blocks(repo, write=not args.check)
    kept = [s for s in stale if "(not generated: " in s]
    missing = [s for s in stale if s.startswith("(no page)")]
    for s in kept:
        print(f"generated block kept as it was: {s}", file=sys.stderr)
    if args.check and stale:
        for s in stale:
            if s not in kept:
                print(f"stale generated block: {s}; run `python tools/gen_docs.py`",
                      file=sys.stderr)
        return 1
    if missing:
        for s in missing:
            print(f"generated block without a page: {s}; add its markers to a docs page",
                  file=sys.stderr)
        return 1
    for s in stale:
        if s not in kept:
            print(f"rewrote {s}")
    return 1 if kept else 0


if __name__ == "__main__":
    raise SystemExit(main())
