"""`optim.optimizer: schedule_free_adamw`: it trains, its HF checkpoints hold the averaged
weights x (what evaluation should see) while training continues from y untouched, and a
resumed run equals an uninterrupted one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import schedulefree
import torch
from safetensors.torch import load_file

from trainer.config import OptimConfig, parse_run_config
from trainer.loop import Trainer, train
from trainer.optimizers import OPTIMIZERS, build_optimizer, evaluation_weights

SF = {"optimizer": "schedule_free_adamw"}
TIMING = {"time_rollout", "time_logprob", "time_update", "time_step", "tokens_per_sec"}


def _untimed(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def test_registry_builds_each_and_names_them_on_a_bad_value():
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert type(build_optimizer(params, OptimConfig())) is torch.optim.AdamW
    sf = build_optimizer(params, OptimConfig(**SF))
    assert isinstance(sf, schedulefree.AdamWScheduleFree)
    assert sf.param_groups[0]["train_mode"]  # gradients are taken at y from step 1
    assert set(OPTIMIZERS) == {"adamw", "schedule_free_adamw"}
    with pytest.raises(ValueError, match=r"optimizer='sgd' is not registered; choose "
                       r"one of \['adamw', 'schedule_free_adamw'\]"):
        OptimConfig(optimizer="sgd")


def test_it_trains_a_tiny_regression():
    """Least squares on 32 points: the loss at the evaluation weights x falls by 100x."""
    g = torch.Generator().manual_seed(0)
    a, w_true = torch.randn(32, 4, generator=g), torch.randn(4, 1, generator=g)
    b = a @ w_true
    model = torch.nn.Linear(4, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    opt = build_optimizer(model.parameters(), OptimConfig(lr=0.05, **SF))

    def loss() -> float:
        with evaluation_weights(opt), torch.no_grad():
            return float(((model(a) - b) ** 2).mean())

    start = loss()
    for _ in range(300):
        opt.zero_grad()
        ((model(a) - b) ** 2).mean().backward()
        opt.step()
    assert loss() < start / 100


def test_checkpoint_holds_x_and_training_keeps_y(make_cfg):
    cfg = make_cfg("sf", optim={"steps": 3, "lr": 1e-2, **SF}, checkpoint={"eval_steps": [2]})
    trainer = Trainer(cfg)
    trainer.setup(track=False)
    trainer.step()  # after one step x = y = z (the average has one term)
    trainer.step()
    opt = trainer.optimizer
    beta1 = opt.param_groups[0]["betas"][0]
    named = dict(trainer.model.named_parameters())
    y = {n: p.detach().clone() for n, p in named.items()}
    # x by hand from y and z: y = (1 - beta1) z + beta1 x
    x = {n: (y[n] - (1 - beta1) * opt.state[p]["z"]) / beta1 for n, p in named.items()}
    assert max(float((x[n] - y[n]).abs().max()) for n in x) > 1e-5  # two different sequences
    trainer.save()
    saved = load_file(trainer.run.checkpoint(2) / "model.safetensors")
    for n in x:
        torch.testing.assert_close(saved[n], x[n], rtol=1e-5, atol=1e-7)
        assert torch.equal(named[n].detach(), y[n])  # bit for bit: the run is not changed
    assert opt.param_groups[0]["train_mode"]


def test_resume_equals_uninterrupted(make_cfg):
    common = {"optim": {"steps": 3, "lr": 1e-2, **SF}, "checkpoint": {"eval_steps": [1]}}
    full = train(make_cfg("sf_full", **common))
    cut = train(make_cfg("sf_cut", debug={"stop_after_steps": 2}, **common))
    assert (cut / "state" / "resume.pt").exists() and len(_untimed(cut)) == 2
    resumed = train(make_cfg("sf_cut", **common))
    assert _untimed(resumed) == _untimed(full)
    final = {n: load_file(d / "checkpoints" / "step_3" / "model.safetensors")
             for n, d in (("full", full), ("resumed", resumed))}
    for key, value in final["full"].items():
        assert torch.equal(final["resumed"][key], value)


def test_the_run_config_takes_it(make_cfg, tiny_dir, tmp_path):
    cfg = parse_run_config({"model": {"path": str(tiny_dir)}, "optim": SF,
                            "out_dir": str(tmp_path / "r")}, "test")
    assert cfg.optim.optimizer == "schedule_free_adamw"
