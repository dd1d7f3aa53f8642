"""The prepared GPU check: one command, one table, no network, no vLLM.

    python perf/gpu_check.py --out rows.jsonl    # one GPU: stages d, c, a, b while --budget-s lasts
    python perf/gpu_check.py --stages cd         # a subset
    python perf/gpu_check.py --cpu --tiny        # the same code paths on CPU, tiny sizes (CI)

It prints its plan first (each unit with its estimated seconds, and which ones the budget,
540 s by default, leaves out), then each row as it finishes, appended to `--out` (one JSON
line each) at once: a run cut off at any point keeps every row so far, and a second call
with the same `--out` (e.g. `--stages b`) adds its header and rows after the first call's.
A unit that fails is a FAILED row with the error's tail (a subprocess's stderr included),
never the end of the run; a variant that runs out of GPU memory is a "does not fit" row.
Each unit has a timeout from the budget (`unit_timeout`): one that hangs is stopped there,
with every process it started (torchrun's ranks in sessions of their own included:
common.processes), and is a TIMED OUT row; one stuck where a signal cannot reach it (inside a C call) is
recorded as such at the timeout plus a grace period, and the check then exits. Its
temporary folder (stage b's model) is removed on every exit, TERM and INT included; one
left by a KILL is removed by the next call.

Stages (each a row group of the table):
  a  the default sweep's DAPO cell (seed 0) end to end on the device: `python -m trainer`
     on the shipped tiny model in the compute dtype, then `python -m eval --backend hf`
     on its last checkpoint (wall times, median step, Toy Mean@4);
  b  the real loop on a locally built, random-init Qwen3-0.6B-shaped model (the tiny
     tokenizer) with the GPU presets' options (torch_varlen, padding-free, token budget,
     bf16, checkpointing, GRPO's held reference), 3 steps: rollout / log-prob / update s;
     then the same with `model.lora` (rank 32; the reference is the base, no copy);
  c  the update alone (PolicyLogProbs + AdamW, as the trainer builds them) at Qwen3-1.7B
     widths on ~32k real tokens of DAPO-like rows per step, micro-batches of <= 16,384
     tokens, per variant: attention (sdpa padded / sdpa padding-free / torch_varlen),
     activation checkpointing (full / selective / off), regional compile, FSDP2 at world
     size 1 with the trainer's bf16 policy, LoRA rank 32 on every linear layer against full
     fine-tuning: step s, tokens/s, MFU, peak GiB, loss;
  d  the chunked LM head at vocabulary 151,936: the bf16 head-weight gradient's error
     against float64, and 32k positions forward+backward at 2,048-row vs 32-row chunks.
  e  `rollout.mode: async` against the simulated `rollout.staleness: 1` it equals, on the
     tiny model (hf engine): with one GPU the worker shares the trainer's (`python -m
     trainer`); with several the job's GPUs are split, the last one the worker's
     (`rollout.gpus: 1`) and the others FSDP2 ranks under torchrun (`trainer.launch`), the
     simulated run on as many ranks; where the worker ran (its line in the trainer's log),
     whether the metrics are equal and the ratio of their median step times (start-up,
     the worker's own model load, is no part of a step).

MFU = 3 x the forward FLOPs the update computes (2 x the decoder's parameters per real
token, causal attention over each row's own context, and the LM head on the response
tokens only: the chunked head never runs on prompt positions) / step time / the device's
dense bf16 peak (989 TFLOP/s for an H100 SXM or H200, 835 NVL, 756 PCIe): the model's
useful work, recomputation not counted. Every speed claim in docs/performance.md is a ratio
between rows of one run of this script.

Sized for the device (docs/performance.md): stage c's micro-batches hold at most 16,384
tokens, 8,192 for the rows without activation checkpointing on a GPU under 100 GiB (an H100:
the H200 measured 82.4 GiB for FSDP2 without checkpointing at 16,384), so every row fits
both; the note of each row says its micro-batch size.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# dense bf16 TFLOP/s, by CUDA's device name, the first key it contains (PCIe/NVL before SXM)
PEAK_TFLOPS = {"H100 PCIe": 756.0, "H100 NVL": 835.0, "H200": 989.0, "H100": 989.0,
               "A100": 312.0}
BUDGET_S = 540  # the default budget: within a device command's 10 minutes, start-up aside
STAGE_ORDER = "dcabe"  # by value per second: the head's error, the update's variants, the
# loops, the async worker
# Estimated seconds per unit (GPU, CPU --tiny); the GPU column from the H200 run's stage times (a: 52 s of
# training and eval, c: ~2 s a step, 4 steps a variant after building its model) with a
# margin for an H100's slower memory and each unit's start-up, compiles 28 layers for the
# compiled rows: a budget guard, not a measurement.
ESTIMATE_S = {"a": (120, 40), "b": (75, 15), "c": (20, 8), "c compiled": (75, 60), "d": (20, 25),
              "e": (60, 50)}
# The CPU column (--cpu --tiny) is what a 2-core AMD EPYC took (2 threads, 2026-12-07: d 17-20
# s, a 16 s, e 25 s, the whole check 79 s) with a margin; its `calibrate_cpu` took
# CPU_REFERENCE_S, and another machine scales the column by its own calibration.
CPU_REFERENCE_S = 0.31
UNIT_MARGIN = 3.0  # a unit's timeout: this many times its estimate, within the budget left
HARD_GRACE_S = 30.0  # past its timeout, a unit a signal cannot stop ends the check
TMP_PREFIX = "gpu_check_"
SMALL_GPU_GIB = 100  # below it, stage c's rows without checkpointing halve their micro-batch
# Qwen3 widths (published config.json values); --tiny shrinks them to seconds on a CPU.
QWEN3 = {
    "0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128),
    "1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16),
}
VOCAB = 151_936
TINY_MODEL = REPO / "data" / "tiny-model"  # the shipped warm-started tiny Llama + tokenizer


# ---------------------------------------------------------------------------- set-up


class Device:
    """Where the check runs: cuda (NCCL for FSDP2) or the CPU (gloo), with its clocks."""

    def __init__(self, cpu: bool) -> None:
        self.type = "cpu" if cpu else "cuda"
        self.torch = torch.device(self.type)
        self.name = "cpu" if cpu else torch.cuda.get_device_name()
        self.peak = next((v for k, v in PEAK_TFLOPS.items() if k in self.name), None)
        self.memory_gib = (None if cpu else
                           torch.cuda.get_device_properties(0).total_memory / 2**30)

    def sync(self) -> None:
        if self.type == "cuda":
            torch.cuda.synchronize()

    def reset_peak(self) -> None:
        gc.collect()
        if self.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def peak_gib(self) -> float | None:
        return torch.cuda.max_memory_allocated() / 2**30 if self.type == "cuda" else None


def one_rank_group(device: Device) -> None:
    """A process group of one rank, so FSDP2 and its mixed-precision policy run here."""
    import socket

    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def qwen3(size: str, vocab: int, device: Device, seed: int = 0):
    """A random-init Qwen3 of `size` widths (float32 master weights) on the device."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(**QWEN3[size], vocab_size=vocab, max_position_embeddings=8192,
                      tie_word_embeddings=True)  # as Qwen3-0.6B/1.7B/4B
    torch.manual_seed(seed)
    with torch.device(device.torch):
        return Qwen3ForCausalLM(cfg).train()


def dapo_rows(vocab: int, budget: int, max_response: int, seed: int):
    """Prompt/response token lists like a DAPO step's: prompts of 64-256 tokens, log-normal
    responses up to `max_response`, until `budget` real tokens."""
    gen = torch.Generator().manual_seed(seed)
    prompts, responses, total = [], [], 0
    while True:
        p = int(torch.randint(64, 257, (1,), generator=gen))
        r = min(max_response, int(torch.exp(torch.randn(1, generator=gen) * 0.8).item()
                                  * max_response / 4) + 1)
        if total + p + r > budget and prompts:
            return prompts, responses
        prompts.append(torch.randint(4, vocab, (p,), generator=gen).tolist())
        responses.append(torch.randint(4, vocab, (r,), generator=gen).tolist())
        total += p + r


def attention_flops(cfg, lengths: list[int]) -> float:
    """Causal attention's forward FLOPs over each row's own context: QK^T and AV, 4 x layers
    x heads x head dim x the mean context (half the row) per token."""
    per_token = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim
    return sum(n * per_token * n / 2 for n in lengths)


def forward_flops(body_params: int, cfg, lengths: list[int], head_tokens: int) -> float:
    """Forward FLOPs the update computes on rows of `lengths` real tokens: 2 x the decoder's
    parameters (embeddings and head excluded) per token, causal attention
    (`attention_flops`), and the LM head (2 x vocab x hidden) on the `head_tokens` response
    positions alone: the chunked head scores responses, never prompts."""
    weights = 2 * body_params * sum(lengths) + 2 * cfg.vocab_size * cfg.hidden_size * head_tokens
    return weights + attention_flops(cfg, lengths)


def update_flops(body_params: int, cfg, lengths: list[int], head_tokens: int, *,
                 lora: bool) -> float:
    """The update's useful FLOPs, forward + backward. Full fine-tuning: 3 forwards (the
    backward computes input and weight gradients, 2x). Under LoRA the frozen weights get no
    gradient, so the linear layers and the head cost 2 forwards; attention has no weights
    and its backward computes dQ, dK and dV either way (2x its forward): 3 (the adapters'
    own FLOPs, ~rank / hidden of the linears', are not counted)."""
    attention = attention_flops(cfg, lengths)
    weights = forward_flops(body_params, cfg, lengths, head_tokens) - attention
    return (2 if lora else 3) * weights + 3 * attention


def body_params(model) -> int:
    """The decoder's parameters: all but the embeddings and the LM head."""
    return sum(p.numel() for n, p in model.named_parameters()
               if "embed_tokens" not in n and "lm_head" not in n)


@contextmanager
def timed(device: Device):
    """Seconds of the block, device work included."""
    box = SimpleNamespace(s=0.0)
    device.sync()
    start = time.perf_counter()
    yield box
    device.sync()
    box.s = time.perf_counter() - start


# ---------------------------------------------------------------------------- (a) default cell


def run_cli(args: list[str]) -> str:
    """A project CLI in a fresh process, killed at the running unit's deadline (a
    UnitTimeout then); a failure raises with the tail of its stderr (the row then says
    why, instead of a bare CalledProcessError). Returns what it printed (stdout, stderr)."""
    from common.processes import run_tree

    timeout = None if DEADLINE.at is None else max(1.0, DEADLINE.at - time.monotonic())
    try:  # at the timeout (or the unit's alarm) its whole tree goes: torchrun's ranks too
        proc = run_tree([sys.executable, *args], env={**os.environ, "PYTHONPATH": str(REPO)},
                        cwd=REPO, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise UnitTimeout(f"python {' '.join(args[:2])} killed at the unit's timeout "
                          f"({timeout:.0f} s)") from exc
    if proc.returncode:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])[-400:]
        raise RuntimeError(f"python {' '.join(args[:2])} exited {proc.returncode}: {tail}")
    return proc.stdout + proc.stderr


def stage_default_cell(device: Device, tiny: bool, work: Path) -> list[dict]:
    """The default sweep's DAPO cell, seed 0, trained and evaluated on the device by the
    project's CLIs (fresh processes, as a user runs them)."""
    import yaml

    from sweep.expand import expand
    from sweep.runconfig import eval_argv, run_config, run_dir
    from sweep.spec import load_sweep, merged

    steps = [2, 4] if tiny else [10, 20, 30, 40]
    data = merged(yaml.safe_load((REPO / "config" / "default.yaml").read_text()), {
        "results_dir": str(work / "results"), "seeds": [0], "methods": ["DAPO"],
        "base": {"model": {"path": str(TINY_MODEL), "device": device.type},
                 "optim": {"steps": steps[-1]}},
        "eval": {"steps": steps, "benchmarks": ["toy"]},
        "mlflow": {"enabled": False}})
    data["eval"]["limit"] = {"toy": 16} if tiny else {}  # replaced, not merged: no AIME here
    data["eval"]["files"] = {}
    path = work / "default-dapo.yaml"
    path.write_text(yaml.safe_dump(data))
    sweep = load_sweep(path)
    cell = expand(sweep)[0][0]
    cfg_path = work / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(run_config(sweep, cell)))
    start = time.perf_counter()
    run_cli(["-m", "trainer", "--config", str(cfg_path)])
    train_s = time.perf_counter() - start
    rdir = run_dir(sweep, cell.run_id)
    args = [a.replace("{step}", str(steps[-1]))
            for a in eval_argv(sweep, cell.run_id, [steps[-1]], ["toy"])]
    start = time.perf_counter()
    run_cli(["-m", "eval", *args, "--device", device.type])
    eval_s = time.perf_counter() - start
    metrics = [json.loads(line) for line in rdir.metrics.read_text().splitlines()]
    summary = json.loads((rdir.eval_dir(steps[-1]) / "toy.json").read_text())
    score = summary["scorers"]["dapo"]["mean"]
    median = statistics.median(m["time_step"] for m in metrics)
    return [{"stage": "a", "check": f"default DAPO cell, {steps[-1]} steps, then eval (hf)",
             "seconds": train_s + eval_s,
             "note": f"train {train_s:.0f} s + eval {eval_s:.0f} s; step median "
                     f"{median:.2f} s; Toy Mean@4 {100 * score:.2f} at step {steps[-1]}"}]


# ---------------------------------------------------------------------------- (e) async


def split_gpus(count: int) -> tuple[int, int]:
    """(trainer ranks, worker GPUs) for a device with `count` GPUs: the worker takes the
    last one when there are several (the ranks a power of two of the rest, so the batch
    splits evenly), else it shares the only one."""
    if count < 2:
        return 1, 0
    ranks = 1
    while ranks * 2 <= count - 1:
        ranks *= 2
    return ranks, 1


def stage_async(device: Device, tiny: bool, work: Path) -> list[dict]:
    """`rollout.mode: async` against the simulated staleness it equals (k = 1), the shipped
    tiny model through the trainer's CLI (hf engine), the job's GPUs split between the
    trainer's ranks and the worker (`split_gpus`). Where the worker ran (the line the
    trainer prints), whether the two metrics.jsonl are equal (timings aside) and the ratio
    of their median step times."""
    import yaml

    from trainer.config import parse_run_config

    steps = 4 if tiny else 8
    count = torch.cuda.device_count() if device.type == "cuda" else 0
    ranks, worker_gpus = split_gpus(count)
    launch = (["-m", "trainer.launch", "--standalone", "--nproc-per-node", str(ranks)]
              if ranks > 1 else [])
    rows, seconds, step_s, where = {}, {}, {}, ""
    for mode in ("sync", "async"):
        out = work / f"async-{mode}"
        cfg = parse_run_config({
            "run_id": mode, "out_dir": str(out), "seed": 0,
            "model": {"path": str(TINY_MODEL), "device": device.type},
            "rollout": {"staleness": 1, "mode": mode, "max_new_tokens": 32,
                        "prompts_per_step": 2 * ranks,
                        "gpus": worker_gpus if mode == "async" else 0},
            "optim": {"steps": steps}, "tracking": {"mlflow_uri": None, "progress": False},
        }, f"gpu_check:{mode}")
        path = work / f"async-{mode}.yaml"
        path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
        start = time.perf_counter()
        log = run_cli([*launch, "-m", "trainer", "--config", str(path)])
        seconds[mode] = time.perf_counter() - start
        where = where or next((line.split("] ", 1)[1] for line in log.splitlines()
                               if line.startswith("[trainer] rollout worker")), "")
        logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        rows[mode] = [{k: v for k, v in r.items()
                       if not k.startswith("time_") and k != "tokens_per_sec"} for r in logged]
        # the step's time, not the wall's: start-up (the worker's own model load) is no
        # part of what overlapping saves a step
        step_s[mode] = statistics.median(r["time_step"] for r in logged)
    same = rows["sync"] == rows["async"]
    return [{"stage": "e", "check": f"async vs simulated staleness 1, {steps} steps (hf), "
                                    f"{ranks} trainer rank(s) + worker GPUs {worker_gpus}",
             "seconds": seconds["sync"] + seconds["async"],
             "note": f"metrics equal: {same}; median step sync {step_s['sync']:.2f} s, async "
                     f"{step_s['async']:.2f} s ({step_s['sync'] / step_s['async']:.2f}x; wall "
                     f"with start-up {seconds['sync']:.0f} / {seconds['async']:.0f} s); "
                     f"{where or 'the worker line was not seen'}"}]


# ---------------------------------------------------------------------------- (b) real loop


def shaped_model(tiny: bool, work: Path) -> Path:
    """A random-init Qwen3-0.6B-shaped checkpoint with the tiny tokenizer, built once."""
    import shutil

    model_dir = work / "qwen3-shaped"
    if not model_dir.is_dir():
        model = qwen3("tiny" if tiny else "0.6b", VOCAB if not tiny else 512, Device(cpu=True))
        model.save_pretrained(model_dir)
        for f in TINY_MODEL.glob("tok*"):
            shutil.copy(f, model_dir / f.name)
    return model_dir


LOOP_VARIANTS = {"": None, ", LoRA r32": {"rank": 32}}  # name suffix -> model.lora


def stage_real_loop(device: Device, tiny: bool, work: Path, name: str) -> list[dict]:
    """The trainer's own loop (rollout, log-probs, update) for 3 steps on a Qwen3-0.6B-shaped
    random model with the GPU presets' options; GRPO, so a reference is held too; `name`
    picks the variant: LoRA adapters (`model.lora`, rank 32: the reference is the base, no
    copy) or full fine-tuning."""
    from trainer.config import parse_run_config
    from trainer.loop import Trainer

    model_dir = shaped_model(tiny, work)
    lora = LOOP_VARIANTS[name]
    cfg = parse_run_config({
        "run_id": "real-loop", "out_dir": str(work / f"real-loop{bool(lora)}"), "seed": 0,
        "model": {"path": str(model_dir), "device": device.type, "compute_dtype": "bfloat16",
                  "gradient_checkpointing": True, "attn_implementation": "torch_varlen",
                  "lora": lora},
        "method": {"name": "GRPO"},
        "rollout": {"n": 8, "prompts_per_step": 2 if tiny else 16, "max_new_tokens":
                    16 if tiny else 128, "overlong_buffer": 4, "dynamic_sampling": False},
        "optim": {"steps": 3, "lr": 1e-6, "padding_free": True, "micro_batch_size": 64,
                  "max_tokens_per_micro_batch": 16384, "mini_batch_size": None},
        "tracking": {"mlflow_uri": None, "progress": False}}, "gpu_check (b)")
    device.reset_peak()
    trainer = Trainer(cfg)
    trainer.setup(track=False)
    last = [trainer.step() for _ in range(3)][-1]
    trainer.engine.engine.close()
    return [{"stage": "b", "check": f"real loop, Qwen3-0.6B shape, GRPO{name}, step 3",
             "seconds": last["time_step"], "peak_gib": device.peak_gib(),
             "note": f"rollout {last['time_rollout']:.2f} s, log-probs "
                     f"{last['time_logprob']:.2f} s, update {last['time_update']:.2f} s; "
                     f"{last['response_length_mean']:.0f} tokens/response"}]


# ---------------------------------------------------------------------------- (c) the update

# name: (attention, padding_free, checkpointing (None: off), compile, fsdp, LoRA rank)
UPDATE_VARIANTS = {
    "sdpa, padded token budget, full ckpt": ("sdpa", False, "full", False, False, None),
    "sdpa, padding-free (dense block mask), full ckpt": ("sdpa", True, "full", False, False, None),
    "torch_varlen, padding-free, full ckpt": ("torch_varlen", True, "full", False, False, None),
    "torch_varlen, selective ckpt": ("torch_varlen", True, "selective", False, False, None),
    "torch_varlen, no ckpt": ("torch_varlen", True, None, False, False, None),
    "torch_varlen, selective ckpt, compiled layers": ("torch_varlen", True, "selective", True,
                                                      False, None),
    "FSDP2 (ws 1, bf16 policy), torch_varlen, full ckpt": ("torch_varlen", True, "full", False,
                                                           True, None),
    "FSDP2, torch_varlen, selective ckpt": ("torch_varlen", True, "selective", False, True, None),
    "FSDP2, torch_varlen, no ckpt": ("torch_varlen", True, None, False, True, None),
    "FSDP2, torch_varlen, selective ckpt, compiled layers": ("torch_varlen", True, "selective",
                                                             True, True, None),
    "torch_varlen, full ckpt, LoRA r32 (every linear)": ("torch_varlen", True, "full", False,
                                                          False, 32),
    "FSDP2, torch_varlen, full ckpt, LoRA r32": ("torch_varlen", True, "full", False, True, 32),
}


def micro_tokens(device: Device, budget: int, ckpt: str | None) -> int:
    """Stage c's micro-batch token cap: half the step's budget (16,384 at full size),
    halved again for a row without checkpointing on a GPU under SMALL_GPU_GIB, whose
    activations at 16,384 tokens fill an H100 (82.4 GiB measured on the H200)."""
    tokens = budget // 2
    if ckpt is None and device.memory_gib is not None and device.memory_gib < SMALL_GPU_GIB:
        tokens //= 2
    return tokens


def update_variant(device: Device, tiny: bool, name: str, steps: int) -> dict:
    """Steps of PolicyLogProbs + AdamW on one variant; warm-up steps first (FSDP2's lazy
    init, kernel selection, compilation) are not timed."""
    from trainer import distributed
    from trainer.logprobs import PolicyLogProbs, micro_batches, pack
    from trainer.lora import trainable
    from trainer.optimizers import build_optimizer
    from trainer.parallelize import parallelize, prepare_layers

    attn, free, ckpt, compile_, fsdp, rank = UPDATE_VARIANTS[name]
    device.reset_peak()
    model = qwen3("tiny" if tiny else "1.7b", VOCAB if not tiny else 1000, device)
    model.config._attn_implementation = attn
    n_body = body_params(model)
    if rank:
        from trainer.config import LoraSettings
        from trainer.lora import apply_lora

        apply_lora(model, LoraSettings(rank=rank))
    cfg = SimpleNamespace(gradient_checkpointing=ckpt is not None, checkpointing=ckpt or "full",
                          compile=compile_)
    bf16 = torch.bfloat16
    if fsdp:  # FSDP2 on a one-rank mesh: the trainer's bf16 policy, as on N GPUs
        one_rank_group(device)
        prepare_layers(model, cfg, train=True)
        policy = distributed.apply_fsdp(PolicyLogProbs(model), distributed.device_mesh(
            distributed.World(0, 1, 0, 1), device.type), param_dtype=bf16)
    else:
        policy = parallelize(model, cfg, distributed.World(), device.type, bf16, train=True)
    optim = SimpleNamespace(optimizer="adamw", lr=1e-6, weight_decay=0.1, betas=(0.9, 0.999))
    optimizer = build_optimizer(trainable(policy), optim)
    budget, max_response = (2048, 256) if tiny else (32768, 2048)
    batch = pack(*dapo_rows(model.config.vocab_size, budget, max_response, seed=1),
                 pad_id=0).to(device.torch)
    rows = torch.arange(len(batch.input_ids), device=device.torch)
    micro = micro_tokens(device, budget, ckpt)
    groups = micro_batches(batch, rows, 10_000, micro, padding_free=free)
    lengths = batch.attention_mask.sum(-1).tolist()
    tokens = sum(lengths)
    total = batch.response_mask.sum()
    times, loss = [], None
    warmup = 2 if compile_ else 1
    for step in range(warmup + steps):
        with timed(device) as t:
            loss = 0.0
            for g in groups:
                mb = batch.rows(g)
                logp, _ = policy(mb, autocast=bf16, padding_free=free)
                part = -(logp * mb.response_mask).sum() / total
                part.backward()
                loss += float(part.detach())
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if step >= warmup:
            times.append(t.s)
    seconds = statistics.median(times)
    response_tokens = int(batch.response_mask.sum())
    flops = update_flops(n_body, model.config, lengths, response_tokens, lora=bool(rank))
    mfu = flops / seconds / (device.peak * 1e12) if device.peak else None
    computed = sum(batch.rows(g).input_ids.numel() for g in groups) if not free else tokens
    row = {"stage": "c", "check": name, "seconds": seconds, "tokens_per_s": tokens / seconds,
           "mfu": mfu, "peak_gib": device.peak_gib(),
           "note": f"loss {loss:.4f}; {tokens} real tokens, {computed / tokens:.2f}x computed; "
                   f"micro-batches <= {micro:,} tokens"}
    del policy, optimizer, model, batch
    return row


def stage_update(device: Device, tiny: bool, name: str, steps: int) -> list[dict]:
    """One update variant's row; out of GPU memory it is a "does not fit" row."""
    try:
        return [update_variant(device, tiny, name, steps)]
    except torch.OutOfMemoryError as exc:
        first = (str(exc).splitlines() or ["out of memory"])[0][:120]
        return [{"stage": "c", "check": name, "note": f"does not fit on {device.name} "
                                                      f"({device.memory_gib:.0f} GiB): {first}"}]
    finally:
        device.reset_peak()
        if UPDATE_VARIANTS[name][3]:
            restore_dynamo_lru()


def restore_dynamo_lru() -> None:
    """Dynamo's cache-entry order back to torch's default (most recently used first) after a
    compiled row: the trainer turns it off for a process that compiles checkpointed layers
    (trainer.parallelize: the recompute must find the forward's graph), which is that
    process's whole life; here the later rows are other configurations."""
    if hasattr(torch._C._dynamo.eval_frame, "_set_lru_cache"):
        torch._C._dynamo.eval_frame._set_lru_cache(True)


# ---------------------------------------------------------------------------- (d) the LM head


def stage_head(device: Device, tiny: bool) -> list[dict]:
    """The chunked head's bf16 weight gradient against float64 at Qwen's vocabulary (Zipf
    targets: frequent rows get gradient from every chunk), and its speed per chunk size."""
    from trainer.logprobs import head_logprobs

    H, N = (16, 1024) if tiny else (2048, 32768)
    gen = torch.Generator().manual_seed(0)
    hidden = (torch.randn(N, H, generator=gen) * 0.5).to(device.torch)
    weight = (torch.randn(VOCAB, H, generator=gen) * H**-0.5).to(device.torch)
    zipf = torch.arange(1, VOCAB + 1, dtype=torch.float64) ** -1.1
    targets = torch.multinomial(zipf / zipf.sum(), N, replacement=True,
                                generator=gen).to(device.torch)
    grads = {}
    for dtype in (torch.float64, torch.bfloat16):
        w = weight.double() if dtype == torch.float64 else weight.clone()
        w.requires_grad_(True)
        h = hidden.double() if dtype == torch.float64 else hidden
        lp, _ = head_logprobs(h, w, targets, chunk_tokens=2048,
                              compute_dtype=None if dtype == torch.float64 else dtype)
        lp.sum().backward()
        grads[dtype] = w.grad.double()
    err = float((grads[torch.bfloat16] - grads[torch.float64]).norm()
                / grads[torch.float64].norm())
    rows = [{"stage": "d", "check": f"head-weight gradient, bf16 vs float64, V={VOCAB}",
             "note": f"relative error {100 * err:.2f}%"}]
    for chunk in (2048, 32):
        w = weight.clone().requires_grad_(True)
        h = hidden.clone().requires_grad_(True)
        with timed(device) as t:
            lp, _ = head_logprobs(h, w, targets, chunk_tokens=chunk, compute_dtype=torch.bfloat16)
            lp.sum().backward()
        rows.append({"stage": "d", "check": f"head fwd+bwd, {N} positions, {chunk}-row chunks",
                     "seconds": t.s})
    return rows


# ---------------------------------------------------------------------------- the table


def table_head() -> str:
    return ("| stage | check | s | tokens/s | MFU | peak GiB | note |\n"
            "|---|---|---:|---:|---:|---:|---|")


def table_line(r: dict) -> str:
    def fmt(v, spec):
        return "" if v is None else format(v, spec)

    mfu = r.get("mfu")
    return (f"| {r['stage']} | {r['check']} | {fmt(r.get('seconds'), '.2f')} | "
            f"{fmt(r.get('tokens_per_s'), ',.0f')} | "
            f"{'' if mfu is None else f'{100 * mfu:.1f}%'} | "
            f"{fmt(r.get('peak_gib'), '.1f')} | {r.get('note', '')} |")


def table(rows: list[dict]) -> str:
    return "\n".join([table_head(), *map(table_line, rows)])


def header(device: Device) -> str:
    import transformers

    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    memory = "" if device.memory_gib is None else f" ({device.memory_gib:.0f} GiB)"
    return (f"gpu_check: {when}; device {device.name}{memory}; torch {torch.__version__}; "
            f"transformers {transformers.__version__}; peak bf16 "
            f"{device.peak or 'n/a'} TFLOP/s")


class Recorder:
    """Every row printed and appended to `out` (one JSON line, flushed to disk) the moment
    it exists: a run cut off anywhere keeps what it measured. An existing `out` keeps its
    rows: this call's header and rows follow them (a file that is not a gpu_check table is
    refused before anything runs)."""

    def __init__(self, out: Path | None, head: str) -> None:
        self.rows: list[dict] = []
        self.out = out
        self.lock = threading.Lock()  # rows come from the main thread or the watchdog
        if out is not None:
            if out.is_file() and out.stat().st_size and not is_rows_file(out):
                raise SystemExit(f"gpu_check: --out {out} exists and is not a gpu_check rows "
                                 "file (its first line is no header); name another file")
            self.write({"header": head})

    def write(self, line: dict) -> None:
        with self.out.open("a") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def add(self, row: dict) -> None:
        with self.lock:
            self.rows.append(row)
            print(table_line(row), flush=True)
            if self.out is not None:
                self.write(row)


def is_rows_file(path: Path) -> bool:
    first = path.read_text().split("\n", 1)[0]
    try:
        return "header" in json.loads(first)
    except json.JSONDecodeError:
        return False


def read_calls(path: Path) -> list[tuple[str, list[dict]]]:
    """[(header, rows)] of every call that wrote to a `--out` file, in order."""
    calls: list[tuple[str, list[dict]]] = []
    for line in path.read_text().splitlines():
        if line.strip():
            entry = json.loads(line)
            if "header" in entry:
                calls.append((entry["header"], []))
            else:
                calls[-1][1].append(entry)
    return calls


def read_rows(path: Path) -> tuple[str, list[dict]]:
    """(the first call's header, every call's rows) of a `--out` file, as far as written."""
    calls = read_calls(path)
    return calls[0][0], [row for _, rows in calls for row in rows]


# ---------------------------------------------------------------------------- exits


class UnitTimeout(BaseException):
    """A unit passed its timeout. Not an Exception: a unit's own `except Exception` (the
    trainer's, a library's) must not swallow it."""


DEADLINE = SimpleNamespace(at=None)  # the running unit's deadline (time.monotonic), run_cli's


def unit_timeout(estimate_s: float, left_s: float, margin: float = UNIT_MARGIN) -> float:
    """A unit's timeout: `margin` times its estimate, within the budget left."""
    return max(1.0, min(left_s, margin * estimate_s))


@contextmanager
def alarm(seconds: float, what: str):
    """Inside: UnitTimeout raised in the main thread after `seconds` (SIGALRM), wherever
    Python code runs or waits (a subprocess is killed by subprocess.run on the way out)."""
    def ring(signum, frame):
        raise UnitTimeout(f"{what} passed its {seconds:.0f} s timeout")

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


STOP = SimpleNamespace(signal=None)  # the TERM or HUP received, if any


def exit_on_signals() -> None:
    """TERM and HUP end the check as an exception would (SystemExit), so every `finally`
    runs: the temporary folder is removed and a stage-a child is killed. (INT already
    raises KeyboardInterrupt.) The signal is also kept in STOP: an exception raised while
    a finalizer runs (a gc pass inside a unit) is swallowed by Python, and the check then
    stops before its next unit instead."""
    def stop(signum, frame):
        STOP.signal = signum
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)


def remove_stale_work(tmp: Path) -> list[Path]:
    """Remove the temporary folders of earlier checks whose process is gone (a KILL leaves
    them: stage b's model is 2.4 GB at full size); returns them."""
    from common.processes import pid_alive

    gone = []
    for folder in tmp.glob(f"{TMP_PREFIX}*"):
        pid = folder.name.removeprefix(TMP_PREFIX).split("_")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            gone.append(folder)
    return gone


@dataclass
class Unit:
    """One row group the check runs: its stage, name, cost estimate and the call."""

    stage: str
    name: str
    estimate_s: float
    run: Callable[[], list[dict]]


def calibrate_cpu() -> float:
    """Seconds this machine takes for a fixed mix of what the CPU units spend their time on
    (a vocabulary-wide bf16 and float64 product, as stage d's head, and the many small ops
    of a tiny model's step), in this process's threads: the best of three after a warm-up,
    so a busy moment does not count."""
    gen = torch.Generator().manual_seed(0)
    wide = torch.randn(VOCAB, 16, generator=gen)
    small = torch.randn(64, 64, generator=gen)
    best = float("inf")
    for i in range(4):  # the first warms the kernels and the thread pool up, uncounted
        start = time.perf_counter()
        for dtype in (torch.bfloat16, torch.float64):
            w = wide.to(dtype)
            (w @ w[:256].T).sum().item()
        x = small
        for _ in range(6000):
            x = torch.tanh(x @ small) * 0.5
        if i:
            best = min(best, time.perf_counter() - start)
    return best


def cpu_scale(calibration_s: float) -> float:
    """How much slower than the machine the CPU estimates were measured on this one is (never
    below 1: a faster machine keeps the estimates, the budget's guard)."""
    return max(1.0, calibration_s / CPU_REFERENCE_S)


def plan(device: Device, args, work: Path, scale: float = 1.0) -> list[Unit]:
    """The units of `args.stages`, in order, each with its estimated seconds (on CPU, the
    reference machine's times `scale`d by `cpu_scale`)."""
    gpu = 0 if device.type == "cuda" else 1
    estimate = {k: (v[0], v[1] * scale) for k, v in ESTIMATE_S.items()}
    units = []
    for stage in args.stages:
        if stage == "a":
            units.append(Unit("a", "default DAPO cell + eval", estimate["a"][gpu],
                              lambda: stage_default_cell(device, args.tiny, work)))
        elif stage == "b":
            for name in LOOP_VARIANTS:
                units.append(Unit("b", f"real loop{name}", estimate["b"][gpu],
                                  lambda name=name: stage_real_loop(device, args.tiny, work, name)))
        elif stage == "c":
            for name, variant in UPDATE_VARIANTS.items():
                compiled = variant[3]
                if compiled and args.tiny:
                    continue  # inductor on a CPU: minutes; tests/trainer/test_parallelize.py
                units.append(Unit("c", name, estimate["c compiled" if compiled else "c"][gpu],
                                  lambda name=name: stage_update(device, args.tiny, name,
                                                                 args.steps)))
        elif stage == "d":
            units.append(Unit("d", "chunked LM head", estimate["d"][gpu],
                              lambda: stage_head(device, args.tiny)))
        elif stage == "e":
            units.append(Unit("e", "async rollouts", estimate["e"][gpu],
                              lambda: stage_async(device, args.tiny, work)))
    return units


def fits(units: list[Unit], budget_s: float) -> list[bool]:
    """Which units the budget runs, in order: each runs while the estimates so far fit."""
    used, out = 0.0, []
    for u in units:
        out.append(used + u.estimate_s <= budget_s)
        used += u.estimate_s if out[-1] else 0.0
    return out


def failed_row(unit: Unit, exc: BaseException) -> dict:
    first = (str(exc).splitlines() or [type(exc).__name__])[0][:400]
    return {"stage": unit.stage, "check": unit.name,
            "note": f"FAILED: {type(exc).__name__}: {first}"}


def timeout_row(unit: Unit, seconds: float, timeout: float, stuck: bool = False) -> dict:
    why = ("stuck where no signal reaches it; the check stopped here" if stuck else
           f"stopped at its timeout, min({UNIT_MARGIN:g} x its ~{unit.estimate_s:.0f} s "
           "estimate, the budget left)")
    return {"stage": unit.stage, "check": unit.name, "seconds": seconds,
            "note": f"TIMED OUT after {seconds:.0f} s (timeout {timeout:.0f} s): {why}"}


def run_units(units: list[Unit], planned: list[bool], budget_s: float, record: Recorder,
              device: Device | None = None, margin: float = UNIT_MARGIN,
              grace_s: float = HARD_GRACE_S, on_stuck: Callable[[], None] = lambda: None
              ) -> None:
    """Run the planned units in order, each row recorded as it comes. A unit that would pass
    the budget by its estimate is a skipped row; one that raises is a FAILED row; one that
    passes its timeout (`unit_timeout`) is stopped (SIGALRM) and is a TIMED OUT row. One the
    signal cannot stop (stuck inside a C call) is recorded by a watchdog thread `grace_s`
    after its timeout, which then calls `on_stuck` (the clean-up) and exits the process."""
    start = time.monotonic()
    for u, ok in zip(units, planned):
        if STOP.signal is not None:  # a TERM whose SystemExit was swallowed (exit_on_signals)
            raise SystemExit(128 + STOP.signal)
        elapsed = time.monotonic() - start
        if not ok or elapsed + u.estimate_s > budget_s:
            record.add({"stage": u.stage, "check": u.name,
                        "note": f"skipped: ~{u.estimate_s:.0f} s would pass the "
                                f"{budget_s:.0f} s budget ({elapsed:.0f} s used)"})
            continue
        timeout = unit_timeout(u.estimate_s, budget_s - elapsed, margin)
        began = time.monotonic()
        DEADLINE.at = began + timeout

        def stuck(u=u, timeout=timeout, began=began):
            record.add(timeout_row(u, time.monotonic() - began, timeout, stuck=True))
            on_stuck()
            os._exit(1)

        watchdog = threading.Timer(timeout + grace_s, stuck)
        watchdog.daemon = True
        watchdog.start()
        try:
            with alarm(timeout, u.name):
                rows = u.run()
            for row in rows:
                record.add(row)
        except UnitTimeout:
            record.add(timeout_row(u, time.monotonic() - began, timeout))
        except Exception as exc:  # noqa: BLE001 - a unit's failure is a row, not the end
            record.add(failed_row(u, exc))
        finally:
            watchdog.cancel()
            DEADLINE.at = None
            if device is not None:
                device.reset_peak()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="run on the CPU (gloo for FSDP2)")
    p.add_argument("--tiny", action="store_true", help="tiny widths and batches (seconds)")
    p.add_argument("--stages", default=STAGE_ORDER,
                   help=f"which stages, in the order to run them (default {STAGE_ORDER}: the "
                        "cheap head check and the update's variants first, where a budget "
                        "cuts the end)")
    p.add_argument("--steps", type=int, default=3, help="timed update steps per variant (c)")
    p.add_argument("--budget-s", type=float, default=BUDGET_S,
                   help="seconds the check may take: units whose estimate would not fit are "
                        "skipped (planned up front, re-checked against the clock)")
    p.add_argument("--unit-margin", type=float, default=UNIT_MARGIN,
                   help="a unit's timeout, in times its estimate (within the budget left; "
                        f"default {UNIT_MARGIN:g})")
    p.add_argument("--out", default=None,
                   help="append the rows here as they finish (JSONL; an existing file keeps "
                        "its rows, this call's header and rows follow)")
    args = p.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device; --cpu --tiny runs the same code paths on CPU")
    if unknown := set(args.stages) - set("abcde"):
        sys.exit(f"gpu_check: --stages {args.stages!r}: unknown {sorted(unknown)}; use a, b, c, "
                 "d, e")
    exit_on_signals()
    device = Device(args.cpu)
    head = header(device)
    print(head, flush=True)
    record = Recorder(Path(args.out) if args.out else None, head)
    start = time.perf_counter()
    for folder in remove_stale_work(Path(tempfile.gettempdir())):
        print(f"removed {folder}, left by a check that was killed", flush=True)
    work = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}_"))
    try:
        scale = 1.0
        if device.type == "cpu":  # the CPU estimates are a 2-core laptop's: scaled to this one
            calibration = calibrate_cpu()
            scale = cpu_scale(calibration)
            print(f"CPU calibration: {calibration:.2f} s against the reference's "
                  f"{CPU_REFERENCE_S:.2f} s: estimates x{scale:.2f}", flush=True)
        units = plan(device, args, work, scale)
        planned = fits(units, args.budget_s)
        total = sum(u.estimate_s for u, ok in zip(units, planned) if ok)
        print(f"plan (budget {args.budget_s:.0f} s, {total:.0f} s estimated; each unit "
              f"stopped at {args.unit_margin:g}x its estimate):", flush=True)
        for u, ok in zip(units, planned):
            print(f"  {u.stage} {u.name}: ~{u.estimate_s:.0f} s{'' if ok else ' (skipped: budget)'}",
                  flush=True)
        print(table_head(), flush=True)
        run_units(units, planned, args.budget_s, record, device, args.unit_margin,
                  on_stuck=lambda: shutil.rmtree(work, ignore_errors=True))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if STOP.signal is not None:  # swallowed during the last unit
        return 128 + STOP.signal
    print(f"gpu_check: {time.perf_counter() - start:.0f} s", flush=True)
    print(table(record.rows))
    bad = ("FAILED", "TIMED OUT")
    return 0 if not any(r.get("note", "").startswith(bad) for r in record.rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
