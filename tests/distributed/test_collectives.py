"""Collectives: the device each backend's tensors live on, rollouts gathered as tensors,
and FSDP2 generation leaving every layer resharded (2 processes, gloo, CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.distributed import collective_device

HERE = Path(__file__).resolve().parent
TORCHRUN = [sys.executable, "-m", "trainer.launch", "--standalone", "--nproc-per-node", "2"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize(("backend", "local_rank", "device"), [
    ("nccl", 3, torch.device("cuda", 3)),  # NCCL has no CPU path
    ("gloo", 3, torch.device("cpu")),
    ("cpu:gloo,cuda:nccl", 1, torch.device("cpu")),  # a mixed group takes CPU tensors
])
def test_collective_tensors_live_where_the_backend_can_reduce_them(backend, local_rank,
                                                                    device):
    assert collective_device(backend, local_rank) == device


@pytest.fixture(scope="module")
def probe(tiny_dir, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("probe") / "found.json"
    proc = subprocess.run([*TORCHRUN, str(HERE / "collectives_probe.py"), str(tiny_dir),
                           str(out)], env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_gloo_collectives_use_cpu_tensors(probe):
    assert probe["device"] == "cpu"


def test_rounds_gathered_as_tensors_equal_all_gather_object(probe):
    """Ragged token ids, float64 log-probs (or None from the hf engine), rewards and flags:
    the same Python values, in rank order, as all_gather_object gives."""
    assert probe["rounds_equal_lp=True"] and probe["rounds_equal_lp=False"]
    assert probe["gather_equal"]


def test_generation_unshards_every_layer_and_reshards_them_all_after(probe):
    assert probe["fsdp_modules"] == 3  # 2 decoder layers + the root
    assert probe["sharded_before"] == []
    assert probe["sharded_inside"] == []  # every layer gathered before the first token
    assert probe["unsharded_after"] == []
