"""The embedded default starts every machine from the same policy: the `tiny_model` rule
copies the repository's data/tiny-model (the warm start depends on the CPU's kernels, so a
local build would not), and a rebuild stays one option away (`tiny: {rebuild: true}`)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from workflow_helpers import REPO, snakemake_exe

from trainer.tiny import TinyConfig

SHIPPED = REPO / "data" / "tiny-model"


def _snakemake(tmp_path: Path, *extra: str, env_update: dict, drop=(),
               overlay: str = "{}") -> tuple[str, Path]:
    """Build (or dry-run) the default sweep's model under tmp_path; `overlay` is YAML
    merged over config/default.yaml."""
    (tmp_path / "overlay.yaml").write_text(overlay + "\n")
    env = {**os.environ, **env_update,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for key in drop:
        env.pop(key, None)
    model = tmp_path / "default" / "model"
    proc = subprocess.run(
        [snakemake_exe(), "-c1", "-p", str(model), "--configfile", "config/default.yaml",
         str(tmp_path / "overlay.yaml"),
         "--config", f"results_dir={tmp_path}", *extra],
        cwd=REPO, env=env, text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr, model


def test_shipped_model_is_the_builders_default():
    shipped = json.loads((SHIPPED / "tiny_config.json").read_text())
    assert shipped == TinyConfig().model_dump(), (
        "data/tiny-model was built with other settings than TinyConfig's defaults: rebuild it "
        "with `ATEN_CPU_CAPABILITY=default python -m trainer tiny --out data/tiny-model`")


@pytest.mark.parametrize("kernels", ["default", "host"])
def test_default_starting_model_is_the_shipped_bytes(tmp_path, kernels):
    env = {"ATEN_CPU_CAPABILITY": "default"} if kernels == "default" else {}
    drop = () if kernels == "default" else ("ATEN_CPU_CAPABILITY",)
    log, model = _snakemake(tmp_path, env_update=env, drop=drop)
    assert "python -m trainer tiny" not in log
    files = sorted(p.name for p in SHIPPED.iterdir())
    assert sorted(p.name for p in model.iterdir() if not p.name.startswith(".snakemake")) == files
    for name in files:
        assert (model / name).read_bytes() == (SHIPPED / name).read_bytes(), name


@pytest.mark.parametrize("overlay", ["tiny: {rebuild: true}", "tiny: {sft_steps: 5}"])
def test_rebuild_is_one_option_away(tmp_path, overlay):
    log, _ = _snakemake(tmp_path, "--dry-run", env_update={}, overlay=overlay)
    assert "python -m trainer tiny --out" in log
    assert str(SHIPPED) not in log
