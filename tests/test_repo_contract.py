"""The README's two commands are what CI runs, and the README and docs/ show what exists."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "config/README.md", *sorted((REPO / "docs").glob("*.md"))]


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


def test_development_page_shows_the_same_test_command():
    assert "    " + readme_commands()[1] in (REPO / "docs/development.md").read_text().splitlines()


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
