"""The GPU presets run the padding-free, variable-length attention path by default, and a
missing flash-attn wheel is a one-line error before any weights load."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from sweep.expand import expand
from sweep.runconfig import run_config
from sweep.spec import load_sweep
from trainer.config import parse_run_config
from trainer.loop import check_attention

REPO = Path(__file__).resolve().parents[2]
PRESETS = ["paper.yaml", "single-gpu.yaml"]


@pytest.mark.parametrize("preset", PRESETS)
def test_gpu_presets_pack_rows_with_flash_attention(preset):
    sweep = load_sweep(REPO / "config" / preset)
    cells, _ = expand(sweep)
    for cell in cells:
        cfg = parse_run_config(run_config(sweep, cell))
        assert cfg.optim.padding_free, (preset, cell)
        assert cfg.model.attn_implementation == "flash_attention_2", (preset, cell)
        assert cfg.optim.max_tokens_per_micro_batch  # a real-token budget per micro-batch


def test_flash_attention_without_the_wheel_names_the_key_and_the_fix(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "flash_attn" else real(name, *a))
    with pytest.raises(ValueError, match=r"model.attn_implementation=flash_attention_2.*"
                                         r"\.\[flash-attn\].*sdpa"):
        check_attention("flash_attention_2")
    check_attention("sdpa")
    check_attention(None)
