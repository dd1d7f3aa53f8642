"""Run config: defaults resolve, unknown keys and bad values are rejected by name."""

from __future__ import annotations

import pytest
import yaml

from trainer.config import RunConfig, load_run_config, parse_run_config


def test_defaults_resolve_label_tags_and_mlflow_uri(tmp_path):
    cfg = parse_run_config({"out_dir": str(tmp_path / "sweep" / "runs" / "r0"),
                            "model": {"path": "m"}})
    assert cfg.label == "RPG-REINFORCE-URKL"
    assert cfg.tags == {"method": "RPG-REINFORCE-URKL"}
    assert cfg.tracking.mlflow_uri == f"sqlite:///{(tmp_path / 'sweep' / 'mlflow.db').resolve()}"
    m = cfg.resolved_method()
    assert m.reference == "rollout" and m.loss.form == "reinforce" and m.loss.divergence == "urkl"


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"rollout": {"temprature": 1.0}}, "rollout.temprature: Extra inputs"),
        ({"bogus": 1}, "bogus: Extra inputs"),
        ({"optim": {"lr": -1}}, "optim.lr"),
        ({"rollout": {"engine": "sglang"}}, "rollout.engine"),
        ({"method": {"name": "PPO-XYZ"}}, "method.name: method='PPO-XYZ' is not registered"),
        ({"method": {"loss": {"beta": -0.1}}}, "method.loss.beta"),
        ({"method": {"loss": {"not_a_field": 1}}}, "method.loss.not_a_field"),
        ({"method": {"reference": {"schedule": "sometimes"}}}, "method.reference.schedule"),
        ({"checkpoint": {"eval_steps": [500]}, "optim": {"steps": 10}}, "checkpoint.eval_steps"),
        ({"optim": {"mini_batch_size": 1000}}, "optim.mini_batch_size"),
    ],
)
def test_bad_input_names_the_key(data, needle):
    with pytest.raises(ValueError) as err:
        parse_run_config(data, "cell.yaml")
    assert "cell.yaml" in str(err.value)
    assert needle in str(err.value)


def test_loss_overrides_and_explicit_loss():
    cfg = parse_run_config({"method": {"name": "RPG-REINFORCE-URKL",
                                       "loss": {"beta": 0.01, "clip": {"eps_high": 0.4}}}})
    loss = cfg.resolved_method().loss
    assert loss.beta == 0.01
    assert (loss.clip.eps_low, loss.clip.eps_high, loss.clip.dual_c) == (0.2, 0.4, 10.0)
    cfg = parse_run_config({"method": {"name": None, "loss": {"divergence": "fkl",
                                                             "form": "differentiable"},
                                       "reference": {"schedule": "every_k", "k": 5}}})
    m = cfg.resolved_method()
    assert (m.loss.objective, m.loss.divergence, m.reference) == ("rpg", "fkl", "every_k")
    assert cfg.label == "custom" and cfg.tags["method"] == "custom"


def test_method_defaults_can_be_switched_in_rollout():
    cfg = parse_run_config({"method": {"name": "DAPO"}, "rollout": {"dynamic_sampling": False}})
    m = cfg.resolved_method()
    assert m.dynamic_sampling is False and m.overlong_shaping is True


def test_load_run_config_names_file_and_roundtrips(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim:\n  stepz: 3\n")
    with pytest.raises(ValueError, match=r"bad\.yaml.*optim\.stepz"):
        load_run_config(bad)
    with pytest.raises(FileNotFoundError):
        load_run_config(tmp_path / "missing.yaml")
    good = tmp_path / "good.yaml"
    cfg = parse_run_config({"run_id": "x", "tags": {"beta": "1e-4"}, "model": {"path": "m"}})
    good.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    again = load_run_config(good)
    assert again == cfg
    assert RunConfig.model_validate(again.model_dump()) == cfg
