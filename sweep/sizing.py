"""Size a sweep's train job before queueing it: per-GPU memory and time per RL step.

    python -m sweep.sizing config/paper.yaml                  # one preset
    python -m sweep.sizing config/paper.yaml config/paper-2k.yaml --gpu h100   # an overlay

Back-of-envelope arithmetic, not a measurement: it says which term dominates and whether
a job fits, to within ~30%. Memory per GPU under FSDP2 with N GPUs per job (P parameters):
fp32 weights 4P/N, fp32 gradients 4P/N, AdamW moments 8P/N, the reference copy (bf16,
sharded) 2P/N when the schedule keeps one, activations of one micro-batch of
`max_tokens_per_micro_batch` tokens (with activation checkpointing: each layer's bf16
input, plus one layer recomputed) plus one LM-head chunk (trainer.logprobs: ~8 float32
[chunk, V] buffers), and vLLM's colocated share (`vllm_gpu_memory_utilization` of the GPU:
a full bf16 copy of the weights, TP=1, and the KV cache in the rest).
Time per step: decoding is memory-bandwidth bound (each generated token reads the weights
once per decode step, shared by the batch, and its sequence's KV cache); the update is
compute bound. A forward costs 2P FLOPs per token plus causal attention, 4 x layers x
(query heads x head dim) x the token's mean context (half its sequence: padding-free
varlen attention does not attend across rows); per step the useful work is the
old-log-prob forward, the reference forward when one is held, forward+backward (3x) and
the chunked head's recompute in backward (2VH per token), done at the MFU measured for the
trainer's update on an H200 (MEASURED_MFU: checkpointing's recompute is inside it).
Checkpointing: the table's last column says whether a job fits its GPU without it (then
set model.gradient_checkpointing: false: the update measured 1.17x faster without).
The bandwidth factor is an assumption, printed with the table.

Host memory (a second table, `host_estimate`): what the job's first node holds beside the
GPUs: vLLM's pinned copy when it sleeps at level 1 (rounded up per tensor to a power of two
by torch's pinned-memory cache: about 21 GiB for Qwen3-8B's 15.3 GiB of bf16 weights), the
async worker's copy and its /dev/shm push, the staleness snapshots, rank 0's whole weights,
and each process's own. A preset whose total passes `resources.train.mem_mb` exits 1 with
one line, and `snakemake -n` refuses it before any job (sweep.checks).
"""

from __future__ import annotations

import argparse
import math
import operator
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from algorithms.methods import get_method
from algorithms.reference import get_reference_schedule
from trainer.logprobs import GPU_CHUNK_BUFFERS, auto_chunk_tokens

GiB = 2**30


@dataclass(frozen=True)
class Arch:
    """What the arithmetic needs of a model (from its config.json)."""

    params: float
    layers: int
    hidden: int
    intermediate: int
    kv_heads: int
    head_dim: int
    heads: int  # query heads
    vocab: int


# Published config.json values of the presets' models (so sizing works offline).
ARCHS = {
    "Qwen/Qwen3-0.6B": Arch(0.60e9, 28, 1024, 3072, 8, 128, 16, 151_936),
    "Qwen/Qwen3-1.7B": Arch(1.72e9, 28, 2048, 6144, 8, 128, 16, 151_936),
    "Qwen/Qwen3-4B": Arch(4.02e9, 36, 2560, 9728, 8, 128, 32, 151_936),
    "Qwen/Qwen3-8B": Arch(8.19e9, 36, 4096, 12288, 8, 128, 32, 151_936),
    "Qwen/Qwen2.5-7B": Arch(7.62e9, 28, 3584, 18944, 4, 128, 28, 152_064),
    "Qwen/Qwen2.5-7B-Instruct": Arch(7.62e9, 28, 3584, 18944, 4, 128, 28, 152_064),
}


@dataclass(frozen=True)
class Gpu:
    memory_gib: float
    bf16_tflops: float  # dense
    hbm_tb_s: float


GPUS = {"h100": Gpu(80, 989, 3.35), "h200": Gpu(141, 989, 4.8), "a100": Gpu(80, 312, 2.0)}
# Model FLOPs utilisation of the trainer's update (3 forwards of useful work per step time),
# measured by the GPU check on one H200 (torch 2.11, 2026-12; Qwen3-1.7B widths, 31.6k
# real tokens per step, micro-batches of <= 16,384 tokens, padding-free varlen attention,
# FSDP2's bf16 policy): 20.4% with activation checkpointing, 23.8% without (issue 35;
# docs/performance.md "The update on an H200").
MEASURED_MFU = {True: 0.204, False: 0.238}  # keyed by model.gradient_checkpointing
# A LoRA step against a full fine-tuning one, measured on CPU only (the LoRA overlay on the
# tiny default: 1.18x at rank 1, 1.22x at 8, 1.28x at 32; docs/results.md): the adapters' two
# small matmuls per linear layer cost more than the skipped weight gradients save. On a GPU
# unmeasured, so the LoRA update is sized as full fine-tuning's work times the largest.
LORA_STEP_RATIO = 1.28
MBU = 0.6  # share of peak bandwidth a decode step reaches
MEAN_RESPONSE = 0.5  # mean response length / max_new_tokens (--mean-response)
PROMPT_TOKENS = 200  # mean prompt length (DAPO-Math-17k with the template)


def model_arch(path: str) -> Arch:
    config = Path(path) / "config.json"
    if config.exists():
        c = yaml.safe_load(config.read_text())  # JSON is YAML
        heads = c["num_attention_heads"]
        head_dim = c.get("head_dim") or c["hidden_size"] // heads
        per_layer = (c["hidden_size"] * (heads + 2 * c.get("num_key_value_heads", heads))
                     * head_dim + heads * head_dim * c["hidden_size"]
                     + 3 * c["hidden_size"] * c["intermediate_size"])
        params = c["num_hidden_layers"] * per_layer + c["vocab_size"] * c["hidden_size"]
        return Arch(params, c["num_hidden_layers"], c["hidden_size"], c["intermediate_size"],
                    c.get("num_key_value_heads", heads), head_dim, heads, c["vocab_size"])
    if path not in ARCHS:
        raise SystemExit(f"sweep.sizing: base.model.path={path!r} is neither a local model "
                         f"directory nor one of {sorted(ARCHS)}; add its shape to ARCHS")
    return ARCHS[path]


def lora_params(arch: Arch, rank: int) -> float:
    """Adapter parameters of LoRA on every linear layer of the decoder (q, k, v, o, gate,
    up, down; the LM head excluded): rank x (fan-in + fan-out) per layer."""
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    h, i = arch.hidden, arch.intermediate
    per_layer = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h)
    return arch.layers * rank * per_layer


def estimate(base: dict, gpus: int, gpu: Gpu, keeps_reference: bool,
             mean_response: float = MEAN_RESPONSE) -> dict[str, float]:
    """Per-GPU GiB of each memory term, and seconds per RL step (rollout, update).

    With `model.lora`: the base weights are frozen in `model.dtype` (bf16: 2 bytes each),
    only the adapters (float32) have gradients and AdamW moments, no reference copy is held
    (the reference is the policy with its adapters off or swapped: trainer.reference), and
    the update takes full fine-tuning's time times LORA_STEP_RATIO (measured on CPU: the
    skipped weight gradients did not make a step cheaper).

    Under `rollout.mode: async` generation overlaps the update (a step takes the larger of
    the two) and one engine decodes every sequence: on the job's last `rollout.gpus` GPUs
    (tensor parallel: weights and KV cache spread over them, each reading its slice per
    decode step), the trainer's ranks on the others with no vLLM share; or, at 0, beside
    rank 0, awake while it trains (its share adds to the peak instead of alternating)."""
    arch = model_arch(base["model"]["path"])
    rollout, optim = base.get("rollout", {}), base.get("optim", {})
    overlapped = rollout.get("mode", "sync") == "async"
    worker_gpus = rollout.get("gpus", 0) if overlapped else 0
    p, n_gpu = arch.params, max(gpus - worker_gpus, 1)  # the trainer's GPUs
    tp = max(worker_gpus, 1)
    lora = base["model"].get("lora")
    trained = lora_params(arch, lora.get("rank", 8)) if lora else p
    weight_bytes = 2 if lora and base["model"].get("dtype") in ("bfloat16", "float16") else 4
    tokens_mb = optim.get("max_tokens_per_micro_batch") or 8192
    layer_act = 2 * (10 * arch.hidden + 4 * arch.intermediate)  # bytes per token, bf16
    ckpt = base["model"].get("gradient_checkpointing", False)
    chunk = auto_chunk_tokens(arch.vocab, "cuda")
    head = GPU_CHUNK_BUFFERS * 4 * chunk * arch.vocab  # one LM-head chunk's backward
    act = {True: tokens_mb * (arch.layers * arch.hidden * 2 + layer_act) + head,
           False: tokens_mb * arch.layers * layer_act + head}  # by checkpointing
    util = rollout.get("vllm_gpu_memory_utilization", 0.35)
    memory = {"weights": (weight_bytes * p + (4 * trained if lora else 0)) / n_gpu,
              "grads": 4 * trained / n_gpu, "adamw": 8 * trained / n_gpu,
              "reference": 2 * p / n_gpu if keeps_reference and not lora else 0.0,
              "activations": act[ckpt],
              "vllm": 0.0 if worker_gpus else util * gpu.memory_gib * GiB}
    new_tokens = rollout.get("max_new_tokens", 8192) * mean_response
    prompts = rollout.get("gen_prompts_per_round") or rollout.get("prompts_per_step", 8)
    # sync: each rank decodes its share; async: the one worker decodes them all
    sequences = prompts * rollout.get("n", 8) / (1 if overlapped else n_gpu)
    kv_per_token = 2 * arch.layers * arch.kv_heads * arch.head_dim * 2
    kv_budget = util * gpu.memory_gib * GiB * tp - 2 * p
    concurrent = max(1.0, min(sequences, kv_budget / (kv_per_token * (PROMPT_TOKENS + new_tokens))))
    mean_context = PROMPT_TOKENS + new_tokens / 2
    step_bytes = 2 * p + concurrent * kv_per_token * mean_context  # one decode step
    decode_steps = new_tokens * sequences / concurrent
    rollout_s = decode_steps * step_bytes / (tp * gpu.hbm_tb_s * 1e12 * MBU)
    train_tokens = (rollout.get("prompts_per_step", 8) * rollout.get("n", 8)
                    * (PROMPT_TOKENS + new_tokens))
    attn_context = (PROMPT_TOKENS + new_tokens) / 2  # causal: half the sequence on average
    forward = 2 * p + 4 * arch.layers * arch.heads * arch.head_dim * attn_context  # per token
    forwards = 1 + (1 if keeps_reference else 0) + 3  # useful work: no recompute
    flops = train_tokens * (forwards * forward + 2 * arch.vocab * arch.hidden)
    update_s = flops / (n_gpu * gpu.bf16_tflops * 1e12 * MEASURED_MFU[bool(ckpt)])
    if lora:
        update_s *= LORA_STEP_RATIO
    out = {k: v / GiB for k, v in memory.items()}
    # Gradients are freed and vLLM sleeps (weights offloaded, KV discarded) in turn, so the
    # peak holds the persistent states plus the larger of the two phases.
    # An async worker beside rank 0 stays awake while it trains: the two add up.
    persistent = out["weights"] + out["adamw"] + out["reference"]
    phases = operator.add if overlapped else max
    out["total"] = persistent + phases(out["grads"] + out["activations"], out["vllm"])
    out["total_without_ckpt"] = persistent + phases(out["grads"] + act[False] / GiB,
                                                    out["vllm"])
    out["kv_cache"] = kv_budget / GiB
    # the worker's GPUs: its slice of the bf16 weights and KV cache, within its share
    out["worker_gpu"] = util * gpu.memory_gib if worker_gpus else 0.0
    out["rollout_min"], out["update_min"] = rollout_s / 60, update_s / 60
    out["step_min"] = (max if overlapped else operator.add)(out["rollout_min"],
                                                           out["update_min"])
    out["update_tflop"] = flops / 1e12
    return out


# ---------------------------------------------------------------------------- host memory

# A training rank's own host memory beside what is sized here (the Python heap, torch and
# CUDA's host state, NCCL's buffers): an assumption, printed with the table.
PROCESS_GIB = 4.0
# Below this many parameters (the tiny test models) the host sizing is all PROCESS_GIB, an
# assumption: `snakemake -n` refuses on host memory only from here up (sweep.checks).
REAL_MODEL_PARAMS = 1e8


def pinned(nbytes: float) -> float:
    """Host bytes of one pinned block: torch's pinned-memory cache (CachingHostAllocator)
    rounds every request up to a power of two."""
    return float(2 ** math.ceil(math.log2(nbytes))) if nbytes > 0 else 0.0


def vllm_weight_tensors(arch: Arch, tied: bool) -> list[float]:
    """bf16 bytes of each weight tensor as vLLM holds it: q, k and v fused, gate and up
    fused, per layer; the embedding, and the LM head unless tied (norms: negligible)."""
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    layer = [(q + 2 * kv) * arch.hidden, q * arch.hidden, 2 * arch.intermediate * arch.hidden,
             arch.intermediate * arch.hidden]
    ends = [arch.vocab * arch.hidden] * (1 if tied else 2)
    return [2.0 * n for n in layer * arch.layers + ends]


def host_estimate(base: dict, resources: dict, staleness: int = 0) -> dict[str, float]:
    """GiB of host memory on the job's first node (rank 0's, the fullest), by term.

    - `pinned`: vLLM asleep at level 1 copies its bf16 weights to pinned host memory, each
      tensor rounded up to a power of two (`pinned`): one copy per engine (each sync rank's,
      or the async worker's, its tensor-parallel slices rounded each); level 2 keeps none.
    - `worker`: the async worker's own copy of the model, where the weights arrive.
    - `hand_off`: one push in /dev/shm (memory): the whole weights, the first time.
    - `staleness`: the k snapshots `rollout.staleness` queues (each rank its slice), k the
      larger of the base's and `staleness` (a grid's largest value).
    - `rank0_full`: rank 0's whole weights at set-up (it reads them for every rank) and for
      each HF checkpoint (gathered in float32).
    - `processes`: PROCESS_GIB per rank and worker on the node."""
    arch = model_arch(base["model"]["path"])
    model, rollout = base.get("model", {}), base.get("rollout", {})
    lora = model.get("lora")
    weight_bytes = 2 if model.get("dtype") in ("bfloat16", "float16") else 4
    trained = lora_params(arch, lora.get("rank", 8)) if lora else 0.0
    full = arch.params * weight_bytes + 4 * trained
    gpus, nodes = resources.get("gpus", 1), resources.get("nodes", 1)
    overlapped = rollout.get("mode", "sync") == "async"
    worker_gpus = rollout.get("gpus", 0) if overlapped else 0
    ranks_here = max(gpus - worker_gpus, 1)
    ranks_all = ranks_here + (nodes - 1) * gpus
    out = dict.fromkeys(("pinned", "worker", "hand_off", "staleness", "rank0_full",
                         "processes"), 0.0)
    if rollout.get("engine", "hf") == "vllm":
        serves_adapters = bool(lora) and rollout.get("vllm_lora", "adapters") == "adapters"
        level = rollout.get("vllm_sleep_level") or (1 if serves_adapters else 2)
        if level == 1:
            tied = arch.params < 5e9  # Qwen3 up to 4B ties its head to the embedding
            tp = max(worker_gpus, 1)
            one = sum(tp * pinned(t / tp) for t in vllm_weight_tensors(arch, tied))
            out["pinned"] = one * (1 if overlapped else ranks_here)
    if overlapped:
        out["worker"] = out["hand_off"] = full
    k = max(rollout.get("staleness", 0), staleness)  # the grid's largest (an axis) counts
    out["staleness"] = k * full * ranks_here / ranks_all
    out["rank0_full"] = full if lora else 4 * arch.params  # LoRA: merged in the base's dtype
    out["processes"] = PROCESS_GIB * GiB * (ranks_here + overlapped)
    out = {key: v / GiB for key, v in out.items()}
    out["total"] = sum(out.values())
    out["node_gib"] = resources.get("mem_mb", 0) / 1024
    return out


def host_table(rows: list[tuple[str, dict]]) -> str:
    lines = ["| preset | vLLM pinned (sleep 1) | async worker | /dev/shm push | staleness "
             "snapshots | rank 0's full copy | processes | host / node | the job asks |",
             "|" + "---|" * 9]
    for name, h in rows:
        lines.append(f"| {name} | {h['pinned']:.1f} | {h['worker']:.1f} | {h['hand_off']:.1f} "
                     f"| {h['staleness']:.1f} | {h['rank0_full']:.1f} | {h['processes']:.0f} | "
                     f"{h['total']:.0f} GiB | {h['node_gib']:.0f} GiB "
                     f"({'fits' if h['total'] <= h['node_gib'] else 'DOES NOT FIT'}) |")
    lines.append(f"\nHost GiB on the job's first node (rank 0's): vLLM asleep at level 1 keeps a "
                 "pinned bf16 copy of its weights, each tensor rounded up to a power of two by "
                 "torch's pinned-memory cache (one per engine: each sync rank's, or the async "
                 "worker's); the async worker's copy of the model and one whole push in "
                 "/dev/shm; the k snapshots of rollout.staleness; rank 0's whole weights (set-"
                 f"up, checkpoints); {PROCESS_GIB:g} GiB per process (an assumption). The job "
                 "asks resources.train.mem_mb.")
    return "\n".join(lines)


def host_refusal(name: str, h: dict) -> str | None:
    """One line when the host total passes what the job asks, else None."""
    if h["node_gib"] and h["total"] > h["node_gib"]:
        return (f"{name}: about {h['total']:.0f} GiB of host memory on the first node, more "
                f"than resources.train.mem_mb={h['node_gib'] * 1024:.0f} "
                f"({h['node_gib']:.0f} GiB): raise mem_mb, or lower the terms in "
                "`python -m sweep.sizing` (vllm_sleep_level: 2 drops the pinned copy)")
    return None


def load(paths: list[str]) -> dict:
    """The merged sweep file(s), overlays last (as `snakemake --configfile a b` merges)."""
    from sweep.spec import merged  # lazy: the sweep spec imports the evaluation's engines

    data: dict = {}
    for path in paths:
        data = merged(data, yaml.safe_load(Path(path).read_text()) or {})
    return data


def table(rows: list[tuple[str, dict]], gpu_name: str, mean_response: float) -> str:
    head = ("| preset | GPUs/job | weights | grads | AdamW | reference | activations | "
            "vLLM (KV) | peak / GPU | rollout / step | update / step | whole run | "
            "checkpointing |")
    lines = [head, "|" + "---|" * 13]
    gpu_memory = GPUS[gpu_name].memory_gib
    for name, r in rows:
        hours = r["steps"] * r["step_min"] / 60
        lines.append(
            f"| {name} | {r['gpus']} | {r['weights']:.1f} | {r['grads']:.1f} | "
            f"{r['adamw']:.1f} | {r['reference']:.1f} | {r['activations']:.1f} | "
            f"{vllm_cell(r)} | {r['total']:.0f} GiB | "
            f"{r['rollout_min']:.1f} min | {r['update_min']:.1f} min | "
            f"{hours:.0f} h ({r['steps']} steps) | {checkpointing_verdict(r, gpu_memory)} |")
    lines.append(f"\nGiB per GPU on {gpu_name}; peak = weights + AdamW + reference + max(grads "
                 f"+ activations, vLLM). Update MFU as measured on an H200 "
                 f"({MEASURED_MFU[True]:.1%} with checkpointing, {MEASURED_MFU[False]:.1%} "
                 f"without; LoRA: x{LORA_STEP_RATIO}, its step-time ratio measured on CPU), "
                 f"decode bandwidth use {MBU}, mean response {mean_response} x "
                 f"max_new_tokens, prompts {PROMPT_TOKENS} tokens; one generation round of "
                 "gen_prompts_per_round prompts per step. Checkpointing: whether the job fits "
                 "without it (peak without it in brackets). Async (rollout.mode): a step takes "
                 "the larger of rollout and update; rollout.gpus of the job's GPUs are the "
                 "worker's (vLLM column: its share of each of them), the rest the trainer's.")
    return "\n".join(lines)


def vllm_cell(row: dict) -> str:
    """vLLM's GiB per GPU (its KV cache in brackets): beside the trainer, or on the async
    worker's own GPUs."""
    if row["worker_gpu"]:
        return f"{row['worker_gpu']:.0f} on its GPUs ({row['kv_cache']:.0f})"
    return f"{row['vllm']:.0f} ({row['kv_cache']:.0f})"


def checkpointing_verdict(row: dict, gpu_memory_gib: float) -> str:
    """"off fits" when the peak without activation checkpointing fits the GPU (a 5% margin
    for the allocator), else "needed"; the peak without it in brackets."""
    fits = row["total_without_ckpt"] <= 0.95 * gpu_memory_gib
    return f"{'off fits' if fits else 'needed'} ({row['total_without_ckpt']:.0f} GiB)"


# The shipped presets (file, then overlays), for `--all` and the cluster docs' table.
PRESETS = [("config/paper.yaml",), ("config/paper.yaml", "config/paper-4k.yaml"),
           ("config/paper.yaml", "config/paper-2k.yaml"),
           ("config/paper.yaml", "config/paper-qwen25-7b.yaml"), ("config/single-gpu.yaml",),
           ("config/single-gpu-lora.yaml",)]


def preset_row(paths, gpu: Gpu, mean_response: float = MEAN_RESPONSE) -> tuple[str, dict]:
    data = load(list(paths))
    gpus = data.get("resources", {}).get("train", {}).get("gpus", 1)
    # A schedule that holds a model (GRPO's fixed one) keeps a reference copy; the RPG
    # methods' reference is the rollout policy (no copy). Size for the larger when mixed.
    keeps_reference = any(get_reference_schedule(get_method(m).reference).holds_model
                          for m in data.get("methods", []))
    row = estimate(data["base"], gpus, gpu, keeps_reference, mean_response)
    row["gpus"], row["steps"] = gpus, data["base"].get("optim", {}).get("steps", 100)
    row["host"] = host_estimate(data["base"], data.get("resources", {}).get("train", {}),
                                max(data.get("axes", {}).get("staleness", [0]) or [0]))
    return data.get("name", paths[0]), row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweep.sizing", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configs", nargs="*", help="sweep file, then overlays")
    parser.add_argument("--all", action="store_true", help="every shipped preset")
    parser.add_argument("--gpu", choices=sorted(GPUS), default="h100")
    parser.add_argument("--mean-response", type=float, default=MEAN_RESPONSE,
                        help="mean response length as a share of max_new_tokens")
    args = parser.parse_args(argv)
    if not args.all and not args.configs:
        parser.error("give a sweep file (and overlays), or --all")
    presets = PRESETS if args.all else [tuple(args.configs)]
    rows = [preset_row(p, GPUS[args.gpu], args.mean_response) for p in presets]
    print(table(rows, args.gpu, args.mean_response))
    print()
    print(host_table([(name, r["host"]) for name, r in rows]))
    refusals = [line for name, r in rows if (line := host_refusal(name, r["host"]))]
    for line in refusals:
        print(f"error: {line}", file=sys.stderr)
    return 1 if refusals else 0


if __name__ == "__main__":
    raise SystemExit(main())
