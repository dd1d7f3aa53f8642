"""The GPU presets run padding-free micro-batches on torch's own variable-length attention
(no extra wheel), and what cannot run on the machine is a one-line error before any weights
load."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from sweep.expand import expand
from sweep.runconfig import run_config
from sweep.spec import load_sweep
from trainer import attention
from trainer.config import parse_run_config
from trainer.parallelize import check_attention

REPO = Path(__file__).resolve().parents[2]
PRESETS = ["paper.yaml", "single-gpu.yaml", "single-gpu-lora.yaml"]


@pytest.mark.parametrize("preset", PRESETS)
def test_gpu_presets_pack_rows_with_torchs_varlen_attention(preset):
    sweep = load_sweep(REPO / "config" / preset)
    cells, _ = expand(sweep)
    for cell in cells:
        cfg = parse_run_config(run_config(sweep, cell))
        assert cfg.optim.padding_free, (preset, cell)
        assert cfg.model.attn_implementation == attention.NAME, (preset, cell)
        assert cfg.optim.max_tokens_per_micro_batch  # a real-token budget per micro-batch


def test_presets_start_without_flash_attn(monkeypatch):
    """A stock install (no flash_attn importable) passes the presets' attention check."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "flash_attn" else real(name, *a))
    check_attention(attention.NAME, "cpu")
    with pytest.raises(ValueError, match=r"model.attn_implementation=flash_attention_2.*"
                                         r"\.\[flash-attn\].*torch_varlen"):
        check_attention("flash_attention_2", "cuda")
    check_attention("sdpa", "cuda")
    check_attention(None, "cuda")


def test_torch_varlen_on_a_gpu_without_torchs_kernel_names_the_fix(monkeypatch):
    monkeypatch.setattr(attention, "kernel", lambda: None)  # a torch before 2.11
    with pytest.raises(ValueError, match=r"torch_varlen needs torch>=2.11 on a GPU.*sdpa"):
        check_attention(attention.NAME, "cuda")
    check_attention(attention.NAME, "cpu")  # the exact fallback needs no kernel


def test_unknown_attention_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"model.attn_implementation: unknown attention "
                                         r"implementation 'flash'.*torch_varlen"):
        parse_run_config({"model": {"attn_implementation": "flash"}})
