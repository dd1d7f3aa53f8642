"""FSDP2 data parallelism, for real: torchrun with 2 processes on the gloo backend (CPU).

World size 2 must reproduce world size 1 on the same global batch; a 2-process run must
finish and write what a 1-process run writes; a SIGTERM must save a state that resumes at
either world size; a failing rank must end the job promptly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from trainer.checkpoint import PREEMPTED_EXIT_CODE

HERE = Path(__file__).resolve().parent
# --standalone: a rendezvous on a free port, so parallel test runs cannot collide.
# trainer.launch is torchrun with the trainer's exit codes (75 = preempted).
TORCHRUN = [sys.executable, "-m", "trainer.launch", "--standalone", "--nproc-per-node", "2"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def write_config(tmp_path: Path, name: str, **sections) -> Path:
    cfg = {"run_id": name, "out_dir": str(tmp_path / "runs" / name), "seed": 0,
           "model": {"path": str(sections.pop("model_path")), "device": "cpu"},
           "rollout": {"n": 4, "prompts_per_step": 4, "max_new_tokens": 24,
                       "overlong_buffer": 4, "dynamic_sampling": False},
           "optim": {"steps": 3, "lr": 1e-3, "mini_batch_size": 8},
           "tracking": {"mlflow_uri": None, "progress": False}}
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def run(cmd: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("case", ["padded", "share_prompt", "lora"])
def test_world_size_2_update_equals_world_size_1(tiny_dir, tmp_path, case):
    """Same global batch, 2 mini-batch updates (the second off-policy), a token budget:
    old log-probs, loss metrics, the first mini-batch's gradients (before the optimizer)
    and the updated weights agree in float32. The script runs Adam with eps = 1, whose step
    is Lipschitz in the gradient, so float32 reduction noise in a gradient stays noise in
    the weights on any CPU kernel (AVX2, AVX-512, ATEN_CPU_CAPABILITY=default). With
    optim.share_prompt and whole groups (the default's settings) the backbone runs twice per
    FSDP2 forward (prompts, then responses on their cache): still the same update. With
    model.lora the adapters are sharded with their layers and only they train."""
    extra = {"share_prompt": True, "whole_groups": True} if case == "share_prompt" else {}
    model = {"lora": {"rank": 2}} if case == "lora" else {}
    cfg = write_config(tmp_path, "eq", model_path=tiny_dir, model=model,
                       optim={"max_tokens_per_micro_batch": 40, "micro_batch_size": 3,
                              "lr": 0.05, **extra})
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    script = str(HERE / "dist_update_script.py")
    for cmd, out in (([sys.executable, script], one), ([*TORCHRUN, script], two)):
        proc = run([*cmd, str(cfg), str(out)])
        assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = torch.load(one), torch.load(two)
    torch.testing.assert_close(b["old_logp"], a["old_logp"], rtol=1e-5, atol=1e-6)
    assert a["metrics"].keys() == b["metrics"].keys()
    for k, v in a["metrics"].items():
        assert b["metrics"][k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    assert a["grads"].keys() == b["grads"].keys() and len(a["grads"]) > 0
    for k, g in a["grads"].items():
        torch.testing.assert_close(b["grads"][k], g, rtol=1e-4, atol=1e-6, msg=k)
    assert a["weights"].keys() == b["weights"].keys()
    for k, w in a["weights"].items():
        torch.testing.assert_close(b["weights"][k], w, rtol=1e-5, atol=1e-6, msg=k)
    # the update really moved the weights (the comparison is not of two untouched models)
    start = AutoModelForCausalLM.from_pretrained(tiny_dir).state_dict()
    if case == "lora":  # only the adapters: B left 0, the base weights did not move
        assert all(".lora_" in k for k in a["grads"])
        assert max(float(w.abs().max()) for k, w in a["weights"].items() if ".lora_B." in k) > 1e-3
        for k, v in start.items():  # every Llama linear is an *_proj, now with a base layer
            assert torch.equal(a["weights"]["model." + k.replace("_proj.", "_proj.base_layer.")],
                               v), k
        return
    moved = max(float((a["weights"]["model." + k] - v).abs().max()) for k, v in start.items())
    assert moved > 1e-3


def test_two_process_run_writes_one_line_per_step_and_a_loadable_checkpoint(tiny_dir, tmp_path):
    cfg = write_config(tmp_path, "ws2", model_path=tiny_dir, checkpoint={"eval_steps": [2]})
    proc = run([*TORCHRUN, "-m", "trainer", "--config", str(cfg)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "runs" / "ws2"
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["groups_kept"] == 4 and r["grad_norm"] is not None for r in rows)
    assert (out / "DONE").exists()
    model = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "step_3")
    assert sum(p.numel() for p in model.parameters()) > 0


def test_sigterm_saves_on_every_rank_exits_75_and_resumes_at_either_world_size(tiny_dir,
                                                                                tmp_path):
    cfg = write_config(tmp_path, "term", model_path=tiny_dir, optim={"steps": 400})
    out = tmp_path / "runs" / "term"
    proc = subprocess.Popen([*TORCHRUN, "-m", "trainer", "--config", str(cfg)], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if (out / "metrics.jsonl").exists() and len(metrics(out)) >= 2:
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGTERM)  # the whole job, as a scheduler does
    assert proc.wait(120) == PREEMPTED_EXIT_CODE, proc.stderr.read()[-3000:]
    done = len(metrics(out))
    assert 2 <= done < 400 and (out / "state" / "resume.pt").exists()
    # Resume at world size 1 from the world-size-2 state, then finish at world size 2.
    data = yaml.safe_load(cfg.read_text())
    data["optim"]["steps"] = done + 1
    cfg.write_text(yaml.safe_dump(data))
    proc1 = run([sys.executable, "-m", "trainer", "--config", str(cfg)])
    assert proc1.returncode == 0, proc1.stderr[-3000:]
    assert [r["step"] for r in metrics(out)] == list(range(1, done + 2))


def test_a_signal_inside_rank0s_checkpoint_write_leaves_a_state_on_every_rank(tiny_dir,
                                                                              tmp_path):
    """Rank 0 sends itself SIGTERM from inside step 2's HF checkpoint write (only rank 0
    writes it; debug.signal_in_checkpoint). Both ranks decide the preemption at step 3 from
    one collective reading and save before exiting 75; the two-reading loop exited 75 at
    step 2 with no state."""
    cfg = write_config(tmp_path, "term-in-save", model_path=tiny_dir,
                       optim={"steps": 5}, checkpoint={"eval_steps": [2]},
                       debug={"signal_in_checkpoint": 2})
    out = tmp_path / "runs" / "term-in-save"
    proc = run([*TORCHRUN, "-m", "trainer", "--config", str(cfg)])
    assert proc.returncode == PREEMPTED_EXIT_CODE, proc.stderr[-3000:]
    assert "preempted (SIGTERM) at step 3, state saved" in proc.stdout
    assert [r["step"] for r in metrics(out)] == [1, 2, 3]
    assert (out / "state" / "resume.pt").exists()
    assert len(list((out / "state").glob("**/*.distcp"))) == 2  # one shard file per rank
    data = yaml.safe_load(cfg.read_text())
    data["debug"]["signal_in_checkpoint"] = None
    cfg.write_text(yaml.safe_dump(data))
    proc = run([*TORCHRUN, "-m", "trainer", "--config", str(cfg)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["step"] for r in metrics(out)] == [1, 2, 3, 4, 5]


def test_the_launcher_reads_a_peer_stopped_after_a_preemption_as_preempted():
    """One rank exits 75 (only after the collective state save returned on every rank) and
    torchrun's agent SIGTERMs (then SIGKILLs) the others: still "preempted, state saved".
    Any other failure keeps torchrun's own exit."""
    from trainer.launch import preempted

    assert preempted({75}) and preempted({75, -signal.SIGTERM})
    assert preempted({75, -signal.SIGKILL, -signal.SIGTERM})
    assert not preempted({-signal.SIGTERM})  # nobody saved
    assert not preempted({75, 1}) and not preempted({1})  # a rank failed otherwise


def test_a_resumed_lora_run_equals_an_uninterrupted_one_at_world_size_2(tiny_dir, tmp_path):
    """The sharded resume state holds the adapters (sharded with their layers), their AdamW
    state and, under every_k, the refreshed reference's adapters: cut at step 2 and resumed,
    the run logs what the uninterrupted one logs and ends with the same weights."""
    sections = dict(model_path=tiny_dir, model={"lora": {"rank": 2}},
                    method={"name": "GRPO", "reference": {"schedule": "every_k", "k": 1}},
                    optim={"steps": 4, "lr": 0.05}, checkpoint={"eval_steps": [4]})
    for name, debug in (("whole", {}), ("cut", {"stop_after_steps": 2}), ("cut", {})):
        cfg = write_config(tmp_path, name, **sections, debug=debug)  # cut, then resumed
        proc = run([*TORCHRUN, "-m", "trainer", "--config", str(cfg)])
        assert proc.returncode == 0, proc.stderr[-3000:]
        if debug:
            assert len(metrics(tmp_path / "runs" / name)) == 2
    timing = ("time_", "tokens_per_sec")
    rows = {name: [{k: v for k, v in r.items() if not k.startswith(timing)}
                   for r in metrics(tmp_path / "runs" / name)] for name in ("whole", "cut")}
    assert rows["cut"] == rows["whole"] and rows["whole"][-1]["ref_updates"] == 4
    a, b = (load_file(tmp_path / "runs" / n / "checkpoints" / "step_4" / "model.safetensors")
            for n in ("whole", "cut"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_failing_rank_ends_the_job_promptly_with_its_error(tiny_dir, tmp_path):
    cfg = write_config(tmp_path, "fail", model_path=tiny_dir, optim={"steps": 50},
                       debug={"fail_at": [1, 2]})
    start = time.monotonic()
    proc = run([*TORCHRUN, "-m", "trainer", "--config", str(cfg)], timeout=240)
    assert proc.returncode != 0
    assert "debug.fail_at: rank 1 fails at step 2" in proc.stderr
    assert time.monotonic() - start < 120
