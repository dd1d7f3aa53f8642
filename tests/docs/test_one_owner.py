"""One owner per fact, checked in the code: every run or sweep path is spelled by
common/layout.py alone, and the default baseline and verdict scorer by analysis/delta.py."""

import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# A folder of the sweep or run layout, or one of its files, inside a string literal. `eval`
# counts only as `/eval/step_...` (an `eval/<bench>/...` string is an MLflow metric key).
FOLDERS = "runs|checkpoints|tables|plots|crosscheck|segments|logs|benchmarks|configs|initial"
ALONE = "runs|checkpoints|tables|plots|segments"  # a folder name as a whole literal
FILES = (r"config\.yaml|metrics\.jsonl|DONE|report\.md|mlflow\.db|concordance\.(?:md|csv)"
         r"|resume\.pt|mlflow_pending|mlflow_parent_run_id")
PATH_PIECE = re.compile(rf"^(?:{ALONE})$|(?:^|/)(?:{FOLDERS})/|/(?:{FOLDERS})$"
                        rf"|/eval/step_|/eval$|(?:^|/)(?:{FILES})$")
CODE = sorted([REPO / "Snakefile", *REPO.glob("workflow/rules/*.smk"),
               *(p for pkg in ("analysis", "common", "eval", "sweep", "trainer")
                 for p in (REPO / pkg).rglob("*.py") if p.name != "layout.py")])


def string_literals(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string literal in a Python or Snakemake file, docstrings and
    prose (a literal with a space: a message or a help text) left out."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
              if t.type not in (tokenize.COMMENT, tokenize.NL)]
    statement_start = (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    found = []
    for i, tok in enumerate(tokens):
        if tok.type != tokenize.STRING:
            continue
        alone = (i == 0 or tokens[i - 1].type in statement_start) and (
            i + 1 == len(tokens) or tokens[i + 1].type == tokenize.NEWLINE)
        text = re.sub(r"^[A-Za-z]*(\"\"\"|'''|\"|')", "", tok.string)
        text = text[: len(text) - (3 if tok.string.endswith(("'''", '"""')) else 1)]
        if not alone and not re.search(r"\s", text):
            found.append((tok.start[0], text))
    return found


def path_literals(path: Path, root: Path = REPO) -> list[str]:
    return [f"{path.relative_to(root)}:{line}: {text!r}" for line, text in string_literals(path)
            if PATH_PIECE.search(text)]


@pytest.mark.parametrize("name, text, caught", [
    ("x.smk", 'rule a:\n    """Writes <sweep>/runs/."""\n    output:\n'
              '        f"{OUT}/runs/{{run_id}}/DONE",\n        str(RUN.done),\n'
              '        "see runs/ for details",\n    log:\n        f"{OUT}/tables",\n',
     ["'{OUT}/runs/{{run_id}}/DONE'", "'{OUT}/tables'"]),
    ("m.py", '"""Reads <sweep>/runs/<id>/config.yaml."""\n'
             'x = root / "runs"\ny = f"eval/{bench}/mean"\nz = run / "eval" / "step_1"\n'
             'w = out / "report.md"\n',
     ["'runs'", "'report.md'"]),
])
def test_the_scan_sees_what_it_looks_for(tmp_path, name, text, caught):
    """The check itself: literal layout pieces are caught, layout calls and prose are not."""
    path = tmp_path / name
    path.write_text(text)
    assert [hit.split(": ", 1)[1] for hit in path_literals(path, tmp_path)] == caught


@pytest.mark.parametrize("path", CODE, ids=lambda p: str(p.relative_to(REPO)))
def test_no_run_or_sweep_path_outside_the_layout_module(path):
    """A rule or module builds every path of a sweep or run from common.layout (SweepDir,
    RunDir, CrosscheckDir): a literal `runs/`, `checkpoints/`, `/eval/step_`, `tables` ...
    is a second owner of the layout."""
    assert path_literals(path) == [], "spell it with common.layout instead"


BASELINE_NAMES = {"DAPO", "dapo"}


@pytest.mark.parametrize("path", sorted((REPO / "analysis").glob("*.py")),
                         ids=lambda p: p.name)
def test_baseline_and_verdict_scorer_are_spelled_once(path):
    """analysis/delta.py owns the default baseline ("DAPO") and the verdict's scorer
    ("dapo"); every other analysis module imports BASELINE_METHOD / VERDICT_SCORER."""
    spelled = [line for line, text in string_literals(path) if text in BASELINE_NAMES]
    if path.name == "delta.py":
        assert len(spelled) == 2
    else:
        assert spelled == [], f"{path.name} lines {spelled}: import it from analysis.delta"
