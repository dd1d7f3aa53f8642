"""`python -m analysis within`: each overlay cell against the same method at the axis's
reference token, numbers by hand (the fixtures' 5 problems x Mean@4, filled problem by
problem), on a two-axis label set so the reference replaces the right token."""

from __future__ import annotations

import pytest
from analysis_fixtures import write_run

from analysis.__main__ import main
from analysis.within import reference_label, split_label

# (label, seed, toy Mean@4 at steps 10 and 20)
RUNS = {
    "grpo_stale0_s0": ("GRPO [stale0 corr-none]", 0, {10: 0.50, 20: 0.50}),
    "grpo_stale1_s0": ("GRPO [stale1 corr-none]", 0, {10: 0.60, 20: 0.45}),
    "grpo_stale1_s1": ("GRPO [stale1 corr-none]", 1, {10: 0.60, 20: 0.45}),  # no stale0 s1
    "urkl_stale0_s0": ("RPG-URKL [stale0 corr-none]", 0, {10: 0.30, 20: 0.70}),
    "urkl_stale2_s0": ("RPG-URKL [stale2 corr-none]", 0, {10: 0.80, 20: 0.80}),
}


@pytest.fixture
def sweep(tmp_path):
    for run_id, (label, seed, by_step) in RUNS.items():
        write_run(tmp_path / "runs", run_id, label, seed, {}, evals={"toy": by_step})
    return tmp_path


def _rows(out: str) -> dict[str, list[str]]:
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()[2:]]
    return {r[0]: r[1:] for r in rows}


def test_labels_split_and_the_reference_replaces_its_own_axis_token():
    assert split_label("GRPO [stale1 corr-none]") == ("GRPO", ["stale1", "corr-none"])
    assert split_label("DAPO") == ("DAPO", [])
    assert reference_label("GRPO [stale1 corr-tis]", "stale0", 0) == "GRPO [stale0 corr-tis]"
    assert reference_label("GRPO [stale1 corr-tis]", "corr-none", 1) == "GRPO [stale1 corr-none]"


def test_each_cell_is_paired_with_its_own_method_at_the_reference(sweep, capsys):
    assert main(["within", "--sweep-dir", str(sweep), "--reference", "stale0"]) == 0
    out = capsys.readouterr().out
    rows = _rows(out.split("\n\n")[0])
    assert set(rows) == {"GRPO [stale1 corr-none]", "RPG-URKL [stale2 corr-none]"}
    # GRPO stale1 vs stale0, seed 0 only (seed 1 has no reference run): Last @20 0.45 vs 0.50
    # = per problem 1,1,.25,0,0 vs 1,1,.5,0,0: Δ -5.00 on one seed: no interval
    grpo = rows["GRPO [stale1 corr-none]"]
    assert grpo[0] == "GRPO [stale0 corr-none]"
    assert grpo[1] == "-5.00"
    # Best: GRPO's best 0.60 @10 vs the reference's best 0.50 (@10, the first of a tie):
    # 1,1,.75,.25,0 vs 1,1,.5,0,0 -> Δ +10.00, a point estimate whatever the seeds
    assert grpo[2] == "+10.00"
    # RPG-URKL stale2 vs stale0 at Last: 0.80 vs 0.70 (1,1,1,1,0 vs 1,1,1,.5,0): +10.00
    urkl = rows["RPG-URKL [stale2 corr-none]"]
    assert urkl[1] == "+10.00" and urkl[2] == "+10.00"
    assert "K = 0 comparisons at Last" in out  # one seed each: nothing tested


def test_an_interval_that_excludes_zero_is_starred_with_its_holm_p(sweep, capsys):
    """Two more seeds on which stale2 leads stale0 by about as much as on seed 0: Δ_s =
    +0.10, +0.15, +0.10, an interval off 0 (t = 7 on 2 df, p = 0.0198), K = 1."""
    for seed, (ref, cell) in enumerate(((0.0, 0.15), (0.20, 0.30)), start=1):
        write_run(sweep / "runs", f"urkl_stale0_s{seed}", "RPG-URKL [stale0 corr-none]", seed,
                  {}, evals={"toy": {10: ref, 20: ref}})
        write_run(sweep / "runs", f"urkl_stale2_s{seed}", "RPG-URKL [stale2 corr-none]", seed,
                  {}, evals={"toy": {10: cell, 20: cell}})
    assert main(["within", "--sweep-dir", str(sweep), "--reference", "stale0"]) == 0
    out = capsys.readouterr().out
    urkl = _rows(out.split("\n\n")[0])["RPG-URKL [stale2 corr-none]"]
    delta, low = urkl[1].split(" [")[0], float(urkl[1].split("[")[1].split(",")[0])
    assert delta == "+11.67" and low > 0 and urkl[1].endswith("* (Holm p 0.020)")
    assert "K = 1 comparisons at Last" in out


def test_a_reference_no_label_carries_is_one_line(sweep, capsys):
    assert main(["within", "--sweep-dir", str(sweep), "--reference", "stale9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--reference 'stale9' is no label's axis token" in err and "stale0" in err


def test_a_folder_without_runs_is_one_line(tmp_path, capsys):
    assert main(["within", "--sweep-dir", str(tmp_path), "--reference", "stale0"]) == 2
    assert "no runs/ folder" in capsys.readouterr().err
