"""What a model's answers look like beyond the grader's verdict, for benchmarks whose answers
are numbers: per evaluation (a run's last evaluated step, or the initial model's), the share of
answers that

- the strict scorer credits (the answer where the prompt asked for it: the training reward's
  kind), and the lenient one (any answer it can find: an evaluation diagnostic),
- hold a \\boxed{} at all,
- end on the right number (the last number in the text equals the gold answer),
- are credited by the lenient scorer for an expression rather than a number (math-verify
  evaluated "58 - 36" out of "16 is 58 - 36.": the question restated, the reward hack
  analysis.gaming looks for),
- were cut off at max_new_tokens, and their mean length in tokens.

The report writes them to tables/answer_forms.csv and its "Answer forms" section;
`python tools/answer_forms.py <sweep or snapshot samples/>` prints them for any folder.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pandas as pd

from analysis.tables import benchmark_order
from common.layout import INITIAL_DIR, RunDir

FORMS = {"strict": "strict", "lenient": "lenient", "has_box": "has box",
         "last_number_right": "last number right", "restated": "credited expression",
         "cut_off": "cut off", "tokens": "tokens"}
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
EXPRESSION = re.compile(r"\d\s*(?:[-+*/]|\\times|\\cdot)\s*\d")


def last_number(text: str) -> str | None:
    found = NUMBER.findall(text.replace(",", ""))
    return found[-1] if found else None


def is_number(text: str) -> bool:
    return NUMBER.fullmatch(str(text).strip().replace(",", "")) is not None


def forms(rows: list[dict], strict: str, lenient: str) -> dict[str, float]:
    """The shares above for one evaluation's per-sample records (eval/run.py's jsonl)."""
    n = len(rows)

    def credited(r: dict, scorer: str) -> bool:
        return bool(r["scorers"].get(scorer, {}).get("correct"))

    return {
        "strict": sum(credited(r, strict) for r in rows) / n,
        "lenient": sum(credited(r, lenient) for r in rows) / n,
        "has_box": sum("\\boxed" in r["completion"] for r in rows) / n,
        "last_number_right": sum(last_number(r["completion"]) == str(r["gold"])
                                 for r in rows) / n,
        "restated": sum(credited(r, lenient) and bool(EXPRESSION.search(
            r["scorers"][lenient].get("extracted") or "")) for r in rows) / n,
        "cut_off": sum(r["finish_reason"] == "length" for r in rows) / n,
        "tokens": sum(r["num_tokens"] for r in rows) / n,
    }


def read(path: Path) -> list[dict]:
    """One evaluation's per-sample records, plain or gzipped (a snapshot's samples/)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def form_table(runs: pd.DataFrame, initial: Path, strict: str, lenient: str) -> pd.DataFrame:
    """One row per (run or the initial model, benchmark with number answers) at its last
    evaluated step: run_id, label, seed, benchmark, step and FORMS. `runs`: collect()'s runs
    frame (run_id, label, seed, run_dir)."""
    rows = []
    sources = [(INITIAL_DIR, "Initial model", -1, initial)]
    sources += [(r.run_id, r.label, int(r.seed), Path(r.run_dir)) for r in runs.itertuples()]
    for run_id, label, seed, run_dir in sources:
        latest: dict[str, tuple[int, Path]] = {}
        for step, step_dir in RunDir(run_dir).eval_steps():
            for path in step_dir.glob("*.jsonl"):
                latest[path.stem] = max(latest.get(path.stem, (-1, path)), (step, path))
        for bench, (step, path) in latest.items():
            records = read(path)
            if records and all(is_number(r["gold"]) for r in records):
                rows.append({"run_id": run_id, "label": label, "seed": seed,
                             "benchmark": bench, "step": step,
                             **forms(records, strict, lenient)})
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame, strict: str, lenient: str) -> str:
    """One table per benchmark, a row per evaluation, the shares in percent."""
    out = [f"Share of answers, at each run's last evaluated step and the initial model's: "
           f"strict = credited by `{strict}`, lenient = by `{lenient}`; credited expression = "
           "credited by the lenient scorer for an expression, not a number (the question "
           "restated); tokens = mean length. `python tools/answer_forms.py` reads the same "
           "from a sweep or a snapshot's samples/.", ""]
    for bench in benchmark_order(table["benchmark"]):
        rows = table[table["benchmark"] == bench]
        out += [f"| {bench} | step | " + " | ".join(FORMS.values()) + " |",
                "|---|---:|" + "---:|" * len(FORMS)]
        for r in rows.itertuples():
            cells = [f"{getattr(r, k):.1f}" if k == "tokens" else f"{100 * getattr(r, k):.1f}%"
                     for k in FORMS]
            name = "Initial model" if r.run_id == INITIAL_DIR else f"`{r.run_id}`"
            out.append(f"| {name} | {r.step} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)
