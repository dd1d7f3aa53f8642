"""FSDP2's bf16 mixed-precision policy and the HSDP mesh, for real on gloo (CPU).

World size 2 with the policy reproduces world size 1 with the same policy (gradients and
loss before any optimizer); a 2 x 2 mesh (two "nodes" of two ranks) builds and trains.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from trainer.distributed import World, mesh_shape

HERE = Path(__file__).resolve().parent
SCRIPT = str(HERE / "mp_policy_script.py")
ENV_ARGS = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def torchrun(nproc: int, *args: str) -> None:
    import os

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(nproc), SCRIPT, *args]
    proc = subprocess.run(cmd, env={**os.environ, **ENV_ARGS}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_mesh_is_flat_on_one_node_and_hsdp_across_nodes():
    assert mesh_shape(World(0, 8, 0, 8)) == (8,)
    assert mesh_shape(World(0, 16, 0, 8)) == (2, 8)  # replicate across 2 nodes, shard in 8
    assert mesh_shape(World(0, 4, 0, 2)) == (2, 2)
    assert mesh_shape(World(0, 6, 0, 4)) == (6,)  # ragged nodes: plain FSDP


def test_world_size_2_with_bf16_policy_equals_world_size_1(tiny_dir, tmp_path):
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    torchrun(1, str(tiny_dir), str(one))
    torchrun(2, str(tiny_dir), str(two))
    a, b = torch.load(one), torch.load(two)
    # the policy is in force: layers compute in bf16, gradients land in float32
    assert a["layer_dtype"] == b["layer_dtype"] == torch.bfloat16
    assert a["grad_dtype"] == b["grad_dtype"] == torch.float32
    assert a["mesh"] == (1,) and b["mesh"] == (2,)
    torch.testing.assert_close(b["loss"], a["loss"], rtol=2e-3, atol=0)
    assert a["grads"].keys() == b["grads"].keys()
    for k, g in a["grads"].items():
        # bf16 compute: each rank's half-batch gradient is rounded to bf16 once before the
        # float32 reduce, the single rank's whole-batch gradient once: ~2^-8 relative.
        err = (b["grads"][k] - g).norm() / g.norm().clamp_min(1e-12)
        assert err < 2e-2, (k, float(err))


def test_2x2_hsdp_mesh_builds_and_trains_one_step(tiny_dir, tmp_path):
    out = tmp_path / "hsdp.pt"
    torchrun(4, str(tiny_dir), str(out), "2")
    r = torch.load(out)
    assert r["mesh"] == (2, 2)
    assert r["layer_dtype"] == torch.bfloat16
    assert torch.isfinite(r["loss"]) and all(torch.isfinite(g).all() for g in r["grads"].values())
    assert r["moved"] > 1e-4


RECOMPUTE = str(HERE / "recompute_cast_script.py")


def _recompute(tmp_path, tiny_dir, mode: str, ckpt: str) -> dict:
    import os

    out = tmp_path / f"{mode}-{ckpt}.pt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", RECOMPUTE, str(tiny_dir), str(out), mode, ckpt]
    proc = subprocess.run(cmd, env={**os.environ, **ENV_ARGS, "PYTHONPATH": str(HERE)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out)


def test_checkpointing_under_the_bf16_policy_survives_fsdp2_before_torch_2_13(tiny_dir, tmp_path):
    """torch < 2.13's FSDP2 does not cast a layer's inputs while recomputing it: the layers
    then recomputed from float32 rotary tensors what they computed from bf16 ones
    ("CheckpointError: Recomputed values ... saved bf16, recomputed float32"), on every GPU
    preset. Emulated here on this torch: the code before the fixes (transformers'
    checkpointing around FSDP2's hooks, float32 layer inputs) fails; each fix alone (the
    checkpoint inside the hooks; layer inputs made in bf16) survives, and with both, full and
    selective checkpointing give the gradients of each other."""
    unfixed = _recompute(tmp_path, tiny_dir, "unfixed", "full")
    assert "Recomputed values" in unfixed.get("error", ""), unfixed.keys()
    assert "error" not in _recompute(tmp_path, tiny_dir, "hooks-outside", "full")
    full = _recompute(tmp_path, tiny_dir, "fixed", "full")
    selective = _recompute(tmp_path, tiny_dir, "fixed", "selective")
    assert "error" not in full and "error" not in selective
    for name, g in full["grads"].items():
        assert torch.isfinite(g).all() and g.abs().sum() > 0, name
        torch.testing.assert_close(selective["grads"][name], g, rtol=0, atol=0)


def test_unsharded_keeps_fsdp2_defaults():
    """Generation's full weights (`distributed.unsharded`) leave FSDP2 as it was: the root
    keeps its gathered parameters after a forward (the default: its float32 embeddings and
    head serve the backward), the layers reshard; so after a rollout no micro-batch gathers
    the root again. The old exit set the root to reshard after every forward."""
    import json

    proc = subprocess.run([sys.executable, str(HERE / "reshard_probe.py")], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["first"] == [False, True]  # FSDP2's defaults: root keeps, layers reshard
    assert got["inside"] == [False, False]  # one all-gather in, none per forward
    assert got["after"] == got["after_error"] == [False, True]
