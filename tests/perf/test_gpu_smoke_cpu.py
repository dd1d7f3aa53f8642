"""perf/gpu_smoke.py, the prepared GPU check, runs end to end in its CPU tiny mode (gloo, 2
ranks, the bf16 FSDP2 policy, padding-free log-probs), so it cannot rot between GPU runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_cpu_tiny_mode_prints_every_measure():
    cmd = [sys.executable, str(REPO / "perf" / "gpu_smoke.py"), "--cpu", "--tiny", "--gpus", "2",
           "--steps", "1", "--tokens", "1024", "--max-len", "128"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "2 rank(s) on cpu, FSDP2 bf16 policy, padding-free sdpa" in out
    assert float(re.search(r"tokens/s: (\d+)", out).group(1)) > 0
    assert "MFU: n/a" in out  # no bf16 peak is known for a CPU
    peaks = re.search(r"peak memory per rank \(GiB\): ([\d., ]+)", out).group(1).split(", ")
    assert len(peaks) == 2 and all(float(p) > 0 for p in peaks)
    mean, worst = map(float, re.search(r"gap: mean (\S+), max (\S+)", out).groups())
    assert 0 < mean <= worst < 0.05  # bf16 against float32: rounding, not a broken path


def test_update_flops_count_as_sweep_sizing_does():
    sys.path.insert(0, str(REPO / "perf"))
    from gpu_smoke import update_flops
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, head_dim=4,
                      vocab_size=10)
    attention = 4 * 2 * 2 * 4 * 50.0
    assert update_flops(1000, cfg, 7, 50.0) == 7 * (3 * (2000 + attention) + 2 * 10 * 8)
