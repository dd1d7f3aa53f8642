"""The README's two commands are what CI runs, and the README shows what the code made."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """The indented one-line commands before the README's first section."""
    head = (REPO / "README.md").read_text().split("\n## ")[0]
    return re.findall(r"^    (pip install torch==2\.13\.0 && .+)$", head, re.M)


def test_readme_opens_with_exactly_two_one_line_commands():
    commands = readme_commands()
    assert len(commands) == 2
    main, tests = commands
    assert main.endswith("snakemake -c all")
    assert tests.endswith("pytest")


def test_ci_runs_the_readme_test_command_verbatim():
    ci = (REPO / ".ci/run").read_text().splitlines()
    assert readme_commands()[1] in ci


def test_readme_images_exist():
    text = (REPO / "README.md").read_text()
    for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (REPO / target).is_file(), target
