"""perf/gpu_check.py, the prepared GPU check, runs every stage in its CPU tiny mode, so the
script a device session runs once cannot rot between GPU sessions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "perf"))


def test_cpu_tiny_mode_runs_every_stage_and_prints_one_table(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(REPO / "perf" / "gpu_check.py"), "--cpu",
                           "--tiny", "--steps", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "| stage | check | s | tokens/s | MFU | peak GiB | note |" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    by_stage = {s: [r for r in rows if r["stage"] == s] for s in "abcd"}
    assert "Toy Mean@4" in by_stage["a"][0]["note"]
    assert len(by_stage["b"]) == 2 and "LoRA" in by_stage["b"][1]["check"]
    assert all("rollout" in r["note"] and r["seconds"] > 0 for r in by_stage["b"])
    updates = by_stage["c"]
    assert len(updates) == 10  # every uncompiled variant (compiling is minutes on a CPU)
    assert sum("LoRA" in r["check"] for r in updates) == 2
    assert all(r["tokens_per_s"] > 0 and r["mfu"] is None for r in updates)  # no CPU peak
    losses = [float(r["note"].split()[1].rstrip(";")) for r in updates]
    assert max(losses) - min(losses) < 1e-2 * abs(losses[0])  # one batch, bf16 noise apart
    padded = next(r for r in updates if "padded" in r["check"])
    assert "x computed" in padded["note"] and "1.00x" not in padded["note"]
    error = float(by_stage["d"][0]["note"].split()[2].rstrip("%"))
    assert 0 < error < 0.6  # bf16 head-weight gradient, accumulated in float32 per chunk


def test_mfu_counts_three_forwards_of_the_real_tokens():
    from gpu_check import forward_flops
    from transformers import Qwen3Config

    cfg = Qwen3Config(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, head_dim=4,
                      vocab_size=10)
    attention = 4 * 2 * 2 * 4
    assert forward_flops(1000, cfg, [10, 4]) == (10 * (2000 + attention * 5)
                                                 + 4 * (2000 + attention * 2))


def test_refuses_to_run_on_no_gpu_and_unknown_stages():
    script = str(REPO / "perf" / "gpu_check.py")
    proc = subprocess.run([sys.executable, script, "--cpu", "--stages", "cx"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "unknown ['x']" in proc.stderr
    if not __import__("torch").cuda.is_available():
        proc = subprocess.run([sys.executable, script], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode != 0 and "no CUDA device" in proc.stderr
