"""The README's two commands are what CI runs, and the README shows what the code made."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    return re.findall(r"^    (pip install torch==2\.13\.0 && .+)$", text, re.M)


def test_readme_opens_with_exactly_two_one_line_commands():
    commands = readme_commands()
    assert len(commands) == 2
    main, tests = commands
    assert main.endswith("snakemake -c all")
    assert tests.endswith("pytest")
    head = (REPO / "README.md").read_text().split("## ")[0]
    assert main in head and tests in head  # both before the first section


def test_ci_runs_the_readme_test_command_verbatim():
    ci = (REPO / ".ci/run").read_text().splitlines()
    assert readme_commands()[1] in ci


def test_readme_images_exist():
    text = (REPO / "README.md").read_text()
    for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (REPO / target).is_file(), target
