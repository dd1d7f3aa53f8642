"""Resume files are data: the state loads with `weights_only=True`, and a planted state whose
unpickling would run code is refused, by `load_state` and by the trainer CLI, without running it."""

from __future__ import annotations

import pickle
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from common.layout import STATE_FILE
from trainer.checkpoint import UnsafeStateError, load_state, save_state
from trainer.tiny import TinyConfig, build_tiny

REPO = Path(__file__).resolve().parents[2]


class WritesMarker:
    """Unpickling this object writes `marker` (what a hostile resume file would do instead)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return Path.write_text, (self.marker, "code ran")


def plant(state_path: Path, marker: Path) -> None:
    """Rewrite a resume state with a code-running object tucked into one of its dicts."""
    state = torch.load(state_path, weights_only=True)
    state["sampler"]["epoch"] = WritesMarker(marker)
    torch.save(state, state_path)


def test_rng_states_round_trip_through_a_weights_only_file(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0, 1)  # leaves a cached second Gaussian in both generators' states
    np.random.standard_normal()
    path = save_state(tmp_path, {"step": 7, "sampler": {"epoch": 0, "pos": 3}})
    torch.load(path, weights_only=True)  # plain data: loads without any allow-list
    expected = (random.random(), random.gauss(0, 1), np.random.rand(),
                np.random.standard_normal(), torch.rand(2).tolist())
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    state = load_state(tmp_path)
    assert state["step"] == 7 and state["sampler"] == {"epoch": 0, "pos": 3}
    assert (random.random(), random.gauss(0, 1), np.random.rand(),
            np.random.standard_normal(), torch.rand(2).tolist()) == expected


def test_planted_state_is_refused_without_running(tmp_path):
    state_path = save_state(tmp_path / "run", {"step": 1, "sampler": {"epoch": 0, "pos": 0}})
    marker = tmp_path / "marker"
    plant(state_path, marker)
    with pytest.raises(UnsafeStateError) as err:
        load_state(tmp_path / "run")
    message = str(err.value)
    assert "\n" not in message and str(state_path) in message
    assert "(it needs getattr;" in message and "delete" in message  # pickled Path.write_text
    assert not marker.exists()
    # The planted file is really hostile: an unrestricted load runs its code.
    torch.load(state_path, weights_only=False)
    assert marker.read_text() == "code ran"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    small = TinyConfig(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                       sft_steps=10, sft_batch_size=8)
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", small, progress=False)


def trainer_cli(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", "--config", str(config)], cwd=REPO,
                          text=True, capture_output=True, timeout=300)


def stopped_after_one_step(tiny_model: Path, tmp_path: Path, out: Path) -> Path:
    """A run config that saves its resume state after step 1 and stops there."""
    cfg = {"run_id": "run", "out_dir": str(out), "seed": 0,
           "model": {"path": str(tiny_model), "device": "cpu"},
           "rollout": {"n": 2, "prompts_per_step": 2, "max_new_tokens": 8, "overlong_buffer": 2},
           "optim": {"steps": 3}, "checkpoint": {"state_every_steps": 1},
           "debug": {"stop_after_steps": 1},
           "tracking": {"mlflow_uri": None, "progress": False}}
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(cfg))
    return config


def test_trainer_cli_refuses_a_planted_state(tiny_model, tmp_path):
    out = tmp_path / "run"
    config = stopped_after_one_step(tiny_model, tmp_path, out)
    first = trainer_cli(config)
    assert first.returncode == 0, first.stderr
    state_path = out / "state" / STATE_FILE
    assert torch.load(state_path, weights_only=True)["step"] == 1  # the trainer writes data

    marker = tmp_path / "marker"
    plant(state_path, marker)
    refused = trainer_cli(config)
    assert refused.returncode == 2
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(state_path) in errors[0], refused.stderr
    assert "Traceback" not in refused.stderr
    assert not marker.exists()
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1  # nothing trained on


def test_trainer_cli_refuses_a_planted_sharded_metadata(tiny_model, tmp_path):
    """The weights and optimizer states are saved sharded (torch.distributed.checkpoint),
    whose `.metadata` is a pickle: a planted one is refused before it can run code."""
    out = tmp_path / "run"
    config = stopped_after_one_step(tiny_model, tmp_path, out)
    assert trainer_cli(config).returncode == 0
    meta = torch.load(out / "state" / STATE_FILE, weights_only=True)
    metadata = out / "state" / meta["tensors"] / ".metadata"
    assert metadata.exists() and not any("model" in k for k in meta)  # tensors live there

    marker = tmp_path / "marker"
    metadata.write_bytes(pickle.dumps(WritesMarker(marker)))
    refused = trainer_cli(config)
    assert refused.returncode == 2
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(metadata.parent) in errors[0], refused.stderr
    assert "pathlib" in errors[0] and "Traceback" not in refused.stderr
    assert not marker.exists()
