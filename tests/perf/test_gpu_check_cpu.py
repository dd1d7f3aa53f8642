"""perf/gpu_check.py, the prepared GPU check, runs every stage in its CPU tiny mode, so the
script a device session runs once cannot rot between GPU sessions; it keeps every row when
cut off, skips what its budget cannot hold, and plans an H100 run inside 10 minutes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "perf"))


SCRIPT = str(REPO / "perf" / "gpu_check.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def test_cpu_tiny_mode_runs_every_stage_and_prints_one_table(tmp_path):
    from gpu_check import read_rows

    out = tmp_path / "rows.jsonl"
    proc = subprocess.run([sys.executable, SCRIPT, "--cpu", "--tiny", "--steps", "1",
                           "--stages", "abcd", "--budget-s", "900", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env=ENV)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "| stage | check | s | tokens/s | MFU | peak GiB | note |" in proc.stdout
    head, rows = read_rows(out)
    assert head.startswith("gpu_check: ") and "device cpu" in head
    by_stage = {s: [r for r in rows if r["stage"] == s] for s in "abcd"}
    assert "Toy Mean@4" in by_stage["a"][0]["note"]
    assert len(by_stage["b"]) == 2 and "LoRA" in by_stage["b"][1]["check"]
    assert all("rollout" in r["note"] and r["seconds"] > 0 for r in by_stage["b"])
    updates = by_stage["c"]
    assert len(updates) == 10  # every uncompiled variant (compiling is minutes on a CPU)
    assert sum("LoRA" in r["check"] for r in updates) == 2
    assert all(r["tokens_per_s"] > 0 and r["mfu"] is None for r in updates)  # no CPU peak
    assert all("micro-batches <= 1,024 tokens" in r["note"] for r in updates)
    losses = [float(r["note"].split()[1].rstrip(";")) for r in updates]
    assert max(losses) - min(losses) < 1e-2 * abs(losses[0])  # one batch, bf16 noise apart
    padded = next(r for r in updates if "padded" in r["check"])
    assert "x computed" in padded["note"] and "1.00x" not in padded["note"]
    error = float(by_stage["d"][0]["note"].split()[2].rstrip("%"))
    assert 0 < error < 0.6  # bf16 head-weight gradient, accumulated in float32 per chunk


def test_a_run_cut_off_midway_keeps_its_rows(tmp_path):
    """SIGKILL once two rows are written: the file holds them, each a whole JSON line, and
    they were printed as they came."""
    from gpu_check import read_rows

    out = tmp_path / "rows.jsonl"
    proc = subprocess.Popen([sys.executable, SCRIPT, "--cpu", "--tiny", "--steps", "1",
                             "--budget-s", "60", "--out", str(out)], env=ENV,
                            stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if out.is_file() and len(read_rows(out)[1]) >= 2:
            break
        time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    stdout, _ = proc.communicate(timeout=60)
    head, rows = read_rows(out)
    assert len(rows) >= 2, stdout[-2000:]
    assert rows[0]["stage"] == "d"  # the default order: the head check first
    for row in rows:
        assert f"| {row['stage']} | {row['check']} |" in stdout  # printed when it finished


def test_the_budget_skips_what_would_not_fit():
    from gpu_check import Unit, fits

    units = [Unit("d", "x", 20, None), Unit("c", "y", 500, None), Unit("c", "z", 30, None)]
    assert fits(units, 60) == [True, False, True]  # a later unit that fits still runs
    assert fits(units, 10) == [False, False, False]


def test_an_h100_plan_finishes_within_10_minutes():
    """The default plan on a GPU (estimates from the H200 run) fits the default budget,
    which leaves a device command's 10 minutes a minute for start-up."""
    from gpu_check import BUDGET_S, STAGE_ORDER, fits, plan

    units = plan(SimpleNamespace(type="cuda"), SimpleNamespace(stages=STAGE_ORDER, tiny=False,
                                                               steps=3), None)
    planned = fits(units, BUDGET_S)
    assert sum(u.estimate_s for u, ok in zip(units, planned) if ok) <= BUDGET_S <= 540
    assert [u.stage for u, ok in zip(units, planned) if ok][:2] == ["d", "c"]
    compiled = [u for u, ok in zip(units, planned) if ok and "compiled" in u.name]
    assert len(compiled) == 2  # selective checkpointing under compile is measured


def test_no_ckpt_rows_halve_their_micro_batches_on_an_h100_not_an_h200():
    from gpu_check import micro_tokens

    h100, h200 = SimpleNamespace(memory_gib=79.1), SimpleNamespace(memory_gib=139.8)
    assert micro_tokens(h100, 32768, None) == 8192 and micro_tokens(h200, 32768, None) == 16384
    assert micro_tokens(h100, 32768, "full") == 16384  # checkpointed rows fit either


def test_mfu_counts_the_update_computes_the_head_on_responses_only():
    from gpu_check import forward_flops
    from transformers import Qwen3Config

    cfg = Qwen3Config(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, head_dim=4,
                      vocab_size=10)
    attention = 4 * 2 * 2 * 4
    head = 2 * 10 * 8
    assert forward_flops(1000, cfg, [10, 4], head_tokens=6) == (
        10 * (2000 + attention * 5) + 4 * (2000 + attention * 2) + 6 * head)


def test_refuses_to_run_on_no_gpu_and_unknown_stages():
    script = SCRIPT
    proc = subprocess.run([sys.executable, script, "--cpu", "--stages", "cx"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "unknown ['x']" in proc.stderr
    if not __import__("torch").cuda.is_available():
        proc = subprocess.run([sys.executable, script], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode != 0 and "no CUDA device" in proc.stderr
