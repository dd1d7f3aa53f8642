"""docs/paper-settings.md is true: each row's "ours" value is what config/paper.yaml (or, for a
row named after an overlay, that overlay on it) resolves to; and every shipped sweep and
overlay runs the clip the table gives."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from sweep.expand import expand
from sweep.runconfig import merged, run_config
from sweep.spec import SweepConfig, load_sweep
from trainer.config import parse_run_config

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "paper-settings.md"
SWEEP = load_sweep(REPO / "config" / "paper.yaml")


def rows() -> list[tuple[str, str, str]]:
    """(method, key, ours) of every table row."""
    out = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[1].startswith("`"):
            out.append((cells[0], cells[1].strip("`"), cells[4].strip("`")))
    return out


def resolved(method: str):
    """The run config of `method`'s first cell in config/paper.yaml (every registered method
    gets a cell: the table may name one that the sweep's method list leaves out)."""
    sweep = SWEEP.model_copy(update={"methods": [method], "seeds": [0]})
    cells, _ = expand(sweep)
    return parse_run_config(run_config(sweep, cells[0]), f"config/paper.yaml:{method}")


def overlaid(*files: str) -> SweepConfig:
    """The sweep that `snakemake --configfile FILES...` runs (later files deep-merged last)."""
    data: dict = {}
    for f in files:
        data = merged(data, yaml.safe_load((REPO / f).read_text()) or {})
    return SweepConfig.model_validate(data)


def lookup(method: str, key: str):
    if method.endswith(".yaml"):  # an overlay row: the merged sweep's own key
        obj = overlaid("config/paper.yaml", f"config/ablations/{method}")
    elif method == "sweep":
        obj = SWEEP
    else:
        cfg = resolved(method)
        obj = cfg.resolved_method() if key.startswith("method.") else cfg
        key = key.removeprefix("method.") if key.startswith("method.") else key
    for part in key.split("."):
        obj = getattr(obj, part)
    if isinstance(obj, list):  # e.g. an axis: a list of settings
        return [v.model_dump() if hasattr(v, "model_dump") else v for v in obj]
    return obj


ROWS = rows()


def test_the_table_has_rows():
    assert len(ROWS) >= 40
    assert len({(m, k) for m, k, _ in ROWS}) == len(ROWS), "a (method, key) row is repeated"


@pytest.mark.parametrize("method, key, ours", ROWS, ids=[f"{m}:{k}" for m, k, _ in ROWS])
def test_row_matches_the_resolved_paper_config(method, key, ours):
    assert lookup(method, key) == yaml.safe_load(ours)


def test_the_doc_reads_no_placeholder():
    assert not re.search(r"\bTODO\b|\?\?", DOC.read_text())


# Every shipped sweep file, and every overlay on each base it documents (ablations on the tiny
# default and on the paper preset; the paper-* overlays on the paper preset).
PAPER_OVERLAYS = sorted(str(p.relative_to(REPO)) for p in (REPO / "config").glob("paper-*.yaml"))
SWEEPS = sorted(str(p.relative_to(REPO)) for p in (REPO / "config").glob("*.yaml")
                if str(p.relative_to(REPO)) not in PAPER_OVERLAYS)
ABLATIONS = sorted(str(p.relative_to(REPO)) for p in (REPO / "config/ablations").glob("*.yaml"))
PRESETS = ([(f,) for f in SWEEPS] + [("config/paper.yaml", f) for f in PAPER_OVERLAYS]
           + [(b, f) for f in ABLATIONS for b in ("config/default.yaml", "config/paper.yaml")])
CLIP_FIELDS = ("eps_low", "eps_high", "dual_c")
DEFAULT_CLIP_METHOD = "RPG-REINFORCE-URKL"  # the paper's clip (Sec. 5), for methods without rows


def table_clip(method: str) -> dict:
    """The clip docs/paper-settings.md gives `method`: its own rows, else the paper's default."""
    own = {k.removeprefix("method.loss.clip."): yaml.safe_load(v) for m, k, v in ROWS
           if m == method and k.startswith("method.loss.clip.")}
    if own:
        return own
    return {k.removeprefix("method.loss.clip."): yaml.safe_load(v) for m, k, v in ROWS
            if m == DEFAULT_CLIP_METHOD and k.startswith("method.loss.clip.")}


def test_every_config_is_a_sweep_or_an_overlay():
    covered = {f for files in PRESETS for f in files}
    shipped = {str(p.relative_to(REPO)) for p in (REPO / "config").rglob("*.yaml")}
    assert shipped == covered
    assert set(table_clip(DEFAULT_CLIP_METHOD)) == set(CLIP_FIELDS)


@pytest.mark.parametrize("files", PRESETS, ids=lambda f: "+".join(x.split("/")[-1] for x in f))
def test_every_run_config_runs_the_tables_clip(files):
    """A cell without a clip axis runs its method's clip as the table gives it; a clip axis
    sets the range (an ablation) but never silently changes the dual clip c."""
    sweep = overlaid(*files)
    cells, _ = expand(sweep)
    for cell in cells:
        cfg = parse_run_config(run_config(sweep, cell), "+".join(files))
        clip = cfg.resolved_method().loss.clip
        want = table_clip(cell.base_method)
        if "clip" not in cell.axes:
            assert clip is not None and {k: getattr(clip, k) for k in want} == want, cell.run_id
        elif clip is not None and want.get("dual_c") is not None:
            assert clip.dual_c == want["dual_c"], f"{files}: {cell.run_id} runs c={clip.dual_c}"
