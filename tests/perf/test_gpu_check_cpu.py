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

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "perf"))


SCRIPT = str(REPO / "perf" / "gpu_check.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def test_cpu_tiny_mode_runs_every_stage_and_prints_one_table(tmp_path):
    from gpu_check import read_rows

    out = tmp_path / "rows.jsonl"
    # the CPU estimates are an idle machine's: a loaded CI runner gets a wide margin
    proc = subprocess.run([sys.executable, SCRIPT, "--cpu", "--tiny", "--steps", "1",
                           "--stages", "abcde", "--budget-s", "900", "--unit-margin", "30",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env=ENV)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "| stage | check | s | tokens/s | MFU | peak GiB | note |" in proc.stdout
    head, rows = read_rows(out)
    assert head.startswith("gpu_check: ") and "device cpu" in head
    by_stage = {s: [r for r in rows if r["stage"] == s] for s in "abcde"}
    assert "metrics equal: True" in by_stage["e"][0]["note"], by_stage["e"]
    assert "rollout worker pid" in by_stage["e"][0]["note"]  # its line was read from the log
    assert "on the CPU, 1 thread(s)" in by_stage["e"][0]["note"]
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


def start_check(tmp_path, out, *args):
    """The check in its own process, its temporary folders under tmp_path/tmp."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, SCRIPT, "--cpu", "--tiny", "--steps", "1",
                             "--unit-margin", "30", "--out", str(out), *args],
                            env={**ENV, "TMPDIR": str(tmp_path / "tmp")},
                            stdout=subprocess.PIPE, text=True)


def work_folders(tmp_path) -> list[Path]:
    return list((tmp_path / "tmp").glob("gpu_check_*"))


def test_a_run_cut_off_midway_keeps_its_rows(tmp_path):
    """SIGKILL once two rows are written: the file holds them, each a whole JSON line, and
    they were printed as they came. Its temporary folder, which no clean-up could remove,
    goes at the next call."""
    from gpu_check import read_rows

    out = tmp_path / "rows.jsonl"
    proc = start_check(tmp_path, out, "--budget-s", "300")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if out.is_file() and len(read_rows(out)[1]) >= 2:
            break
        time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    stdout, _ = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, stdout[-2000:]  # killed, not finished
    head, rows = read_rows(out)
    assert len(rows) >= 2, stdout[-2000:]
    assert rows[0]["stage"] == "d"  # the default order: the head check first
    for row in rows:
        assert f"| {row['stage']} | {row['check']} |" in stdout  # printed when it finished
    (left,) = work_folders(tmp_path)
    again = start_check(tmp_path, tmp_path / "again.jsonl", "--budget-s", "0")  # runs nothing
    stdout, _ = again.communicate(timeout=120)
    assert again.returncode == 0 and f"removed {left}" in stdout
    assert work_folders(tmp_path) == []


def test_term_removes_the_temporary_folder(tmp_path):
    """TERM midway (stage b has written its model into the folder): the check exits at
    once, as SystemExit, and leaves no gpu_check_* folder behind."""
    from gpu_check import read_rows

    out = tmp_path / "rows.jsonl"
    proc = start_check(tmp_path, out, "--stages", "db", "--budget-s", "300")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if any((f / "qwen3-shaped").is_dir() for f in work_folders(tmp_path)):
            break
        time.sleep(0.2)
    assert work_folders(tmp_path), "the check made no folder"
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stdout[-3000:]
    assert work_folders(tmp_path) == []
    assert [r["stage"] for r in read_rows(out)[1]][:1] == ["d"]  # its rows kept


def test_a_second_call_with_the_same_out_keeps_the_first_calls_rows(tmp_path):
    from gpu_check import Recorder, read_calls, read_rows

    out = tmp_path / "rows.jsonl"
    first = Recorder(out, "gpu_check: first")
    first.add({"stage": "d", "check": "x", "note": "1"})
    second = Recorder(out, "gpu_check: second")  # the docs' `--stages b` call
    second.add({"stage": "b", "check": "y", "note": "2"})
    assert read_calls(out) == [("gpu_check: first", [{"stage": "d", "check": "x", "note": "1"}]),
                               ("gpu_check: second", [{"stage": "b", "check": "y", "note": "2"}])]
    assert [r["check"] for r in read_rows(out)[1]] == ["x", "y"]
    other = tmp_path / "notes.txt"
    other.write_text("someone's notes\n")
    with pytest.raises(SystemExit, match="not a gpu_check rows file"):
        Recorder(other, "gpu_check: third")
    assert other.read_text() == "someone's notes\n"


def test_a_hung_unit_ends_at_its_timeout_with_its_row(tmp_path):
    """A unit's timeout is its margin times its estimate, within the budget left; a unit
    that hangs is stopped there, recorded, and the next unit runs."""
    from gpu_check import Recorder, Unit, read_rows, run_units, unit_timeout

    assert unit_timeout(20, left_s=500) == 60 and unit_timeout(20, left_s=30) == 30
    out = tmp_path / "rows.jsonl"
    units = [Unit("c", "hangs", 0.5, lambda: time.sleep(30) or []),
             Unit("d", "after", 0.5, lambda: [{"stage": "d", "check": "after", "note": "ok"}])]
    start = time.monotonic()
    # (a long grace: the watchdog's exit, for a unit no signal reaches, would end pytest)
    run_units(units, [True, True], 100, Recorder(out, "h"), margin=2, grace_s=300)
    assert time.monotonic() - start < 10
    hung, after = read_rows(out)[1]
    assert hung["check"] == "hangs" and hung["note"].startswith("TIMED OUT after ")
    assert "(timeout 1 s)" in hung["note"] and hung["seconds"] < 5
    assert after["note"] == "ok"


def test_stage_as_subprocess_is_killed_at_the_units_deadline():
    from gpu_check import DEADLINE, UnitTimeout, run_cli

    DEADLINE.at = time.monotonic() + 1
    try:
        start = time.monotonic()
        with pytest.raises(UnitTimeout, match="killed at the unit's timeout"):
            run_cli(["-c", "import time; time.sleep(60)"])
        assert time.monotonic() - start < 10
    finally:
        DEADLINE.at = None


# A launcher as torchrun is one: its "rank" in a session of its own, ignoring SIGTERM
STAND_IN_LAUNCHER = """
import subprocess, sys, time
rank = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                         "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('rank up', "
                         "flush=True); time.sleep(600)"], start_new_session=True)
print(f"rank {rank.pid}", flush=True)
time.sleep(600)
"""


def test_a_timeout_kills_the_stages_whole_tree_a_rank_that_ignores_term_included(tmp_path):
    """Stage e's torchrun starts its ranks in sessions of their own: the unit's timeout must
    reach them (a stand-in rank that ignores SIGTERM), not only the launcher."""
    from gpu_check import DEADLINE, UnitTimeout, run_cli

    from common.processes import wait_gone

    pid_file = tmp_path / "launcher.py"
    pid_file.write_text(STAND_IN_LAUNCHER)
    DEADLINE.at = time.monotonic() + 4
    try:
        with pytest.raises(UnitTimeout) as caught:
            run_cli([str(pid_file)])
    finally:
        DEADLINE.at = None
    out = caught.value.__cause__.stdout or ""
    rank = int(next(line.split()[1] for line in out.splitlines() if line.startswith("rank ")))
    assert not wait_gone({rank}), f"the stand-in rank {rank} outlived the unit's timeout"


STUCK = """
import signal, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from gpu_check import Recorder, Unit, run_units

def stuck():  # as if inside a C call: the alarm never reaches this thread
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
    time.sleep(60)

work = Path(sys.argv[3])
run_units([Unit("c", "stuck", 0.5, stuck)], [True], 100, Recorder(Path(sys.argv[2]), "h"),
          margin=2, grace_s=1, on_stuck=lambda: work.rmdir())
"""


def test_a_unit_no_signal_reaches_is_recorded_and_ends_the_check(tmp_path):
    from gpu_check import read_rows

    out, work = tmp_path / "rows.jsonl", tmp_path / "work"
    work.mkdir()
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", STUCK, str(REPO / "perf"), str(out), str(work)],
                          capture_output=True, text=True, timeout=60, env=ENV)
    assert time.monotonic() - start < 30 and proc.returncode == 1, proc.stderr[-2000:]
    (row,) = read_rows(out)[1]
    assert row["note"].startswith("TIMED OUT") and "no signal reaches it" in row["note"]
    assert not work.exists()  # cleaned before the exit


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


def test_cpu_estimates_scale_with_this_machines_calibration():
    """A machine slower than the reference stretches the CPU estimates (and so each unit's
    timeout) by its calibration; a faster one keeps them; GPU estimates never move."""
    from gpu_check import CPU_REFERENCE_S, ESTIMATE_S, calibrate_cpu, cpu_scale, plan

    assert cpu_scale(CPU_REFERENCE_S / 2) == 1.0 and cpu_scale(3 * CPU_REFERENCE_S) == 3.0
    args = SimpleNamespace(stages="d", tiny=True, steps=1)
    (slow,) = plan(SimpleNamespace(type="cpu"), args, None, scale=3.0)
    assert slow.estimate_s == 3 * ESTIMATE_S["d"][1]
    (gpu,) = plan(SimpleNamespace(type="cuda"), args, None, scale=3.0)
    assert gpu.estimate_s == ESTIMATE_S["d"][0]
    assert 0 < calibrate_cpu() < 30


def test_the_async_unit_splits_a_devices_gpus_between_ranks_and_the_worker():
    """One GPU: the worker shares it. Several: the last is the worker's, the trainer a
    power of two of the rest (its batch splits evenly)."""
    from gpu_check import split_gpus

    assert [split_gpus(n) for n in (0, 1, 2, 3, 4, 8)] == [(1, 0), (1, 0), (1, 1), (2, 1),
                                                             (2, 1), (4, 1)]


def test_no_ckpt_rows_halve_their_micro_batches_on_an_h100_not_an_h200():
    from gpu_check import micro_tokens

    h100, h200 = SimpleNamespace(memory_gib=79.1), SimpleNamespace(memory_gib=139.8)
    assert micro_tokens(h100, 32768, None) == 8192 and micro_tokens(h200, 32768, None) == 16384
    assert micro_tokens(h100, 32768, "full") == 16384  # checkpointed rows fit either


def test_lora_counts_attentions_backward_twice_like_full_fine_tuning():
    """Full fine-tuning: 3 forwards of everything. LoRA: the frozen linears and head 2 (no
    weight gradient), attention 3 (dQ, dK, dV: it has no weights either way)."""
    from gpu_check import update_flops
    from transformers import Qwen3Config

    cfg = Qwen3Config(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, head_dim=4,
                      vocab_size=10)
    weights = 14 * 2000 + 6 * 2 * 10 * 8  # 2 x 1000 parameters per token, the head on 6
    attention = 4 * 2 * 2 * 4 * (10 * 5 + 4 * 2)
    lengths = [10, 4]
    assert update_flops(1000, cfg, lengths, 6, lora=False) == 3 * (weights + attention)
    assert update_flops(1000, cfg, lengths, 6, lora=True) == 2 * weights + 3 * attention


def test_a_compiled_row_gives_dynamos_cache_order_back(monkeypatch):
    """The trainer turns Dynamo's LRU cache order off for a process that compiles
    checkpointed layers; the check's later rows are other configurations: restored after
    each compiled row, untouched by the others."""
    import gpu_check
    import torch

    calls = []
    monkeypatch.setattr(torch._C._dynamo.eval_frame, "_set_lru_cache", calls.append,
                        raising=False)
    monkeypatch.setattr(gpu_check, "update_variant", lambda *a: {"stage": "c"})
    device = SimpleNamespace(reset_peak=lambda: None)
    compiled = [n for n, v in gpu_check.UPDATE_VARIANTS.items() if v[3]]
    plain = [n for n, v in gpu_check.UPDATE_VARIANTS.items() if not v[3]]
    gpu_check.stage_update(device, True, plain[0], 1)
    assert calls == []
    gpu_check.stage_update(device, True, compiled[0], 1)
    assert calls == [True]


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
