"""The method is resolved once, by the sweep, with everything that changes it; the run config
carries it; a run config without it (hand-written or older) is resolved when read."""

import pytest
import yaml

from sweep import expand, parse_sweep
from sweep.runconfig import run_config
from trainer.config import dump_run_config, parse_run_config


def sweep(**base):
    return parse_sweep({"name": "t", "base": base, "methods": ["DAPO", "RPG-URKL"],
                        "eval": {"steps": [1], "benchmarks": ["toy"]}})


def test_the_bases_method_settings_reach_the_cell_and_its_run_config():
    """`base.rollout.dynamic_sampling: false` and a base loss override change the method the
    cell (and so its tags, dedup and run config) holds, not only what the trainer would run."""
    s = sweep(rollout={"dynamic_sampling": False}, method={"loss": {"entropy_coef": 0.01}})
    cells, _ = expand(s)
    dapo = next(c for c in cells if c.base_method == "DAPO")
    assert dapo.method.dynamic_sampling is False and dapo.method.overlong_shaping is True
    assert all(c.method.loss.entropy_coef == 0.01 for c in cells)
    cfg = parse_run_config(run_config(s, dapo))
    assert cfg.resolved_method() == dapo.method


def test_a_config_without_the_resolved_method_loads_and_saves_it():
    old = {"method": {"name": "DAPO", "loss": {"beta": 0.0}}, "rollout": {"dynamic_sampling": False}}
    cfg = parse_run_config(old)
    method = cfg.resolved_method()
    assert (method.name, method.dynamic_sampling, method.overlong_shaping) == ("DAPO", False, True)
    saved = yaml.safe_load(dump_run_config(cfg))
    assert saved["method"]["resolved"] == method.model_dump(mode="json")
    assert parse_run_config(saved).resolved_method() == method


@pytest.mark.parametrize("edit, key", [
    (lambda c: c["method"].update(name="GRPO"), "method.name='GRPO'"),
    (lambda c: c["rollout"].update(dynamic_sampling=True), "rollout.dynamic_sampling=True"),
])
def test_a_key_that_contradicts_the_resolved_method_is_refused(edit, key):
    cells, _ = expand(sweep(rollout={"dynamic_sampling": False}))
    cfg = run_config(sweep(rollout={"dynamic_sampling": False}), cells[0])
    edit(cfg)
    with pytest.raises(ValueError, match=rf"{key}.*method.resolved") as err:
        parse_run_config(cfg, "run.yaml")
    assert "\n" not in str(err.value) and str(err.value).startswith("run.yaml: ")
