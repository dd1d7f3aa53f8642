"""Peak memory of an RPG run (reference = rollout policy) vs a GRPO run (fixed reference),
and (--setup) per-rank set-up memory at world size 2, this checkout vs another.

    python perf/reference_memory.py                 # ~30M-parameter Llama, CPU
    python perf/reference_memory.py --device cuda --hidden 2048 --layers 16
    python perf/reference_memory.py --setup --baseline /tmp/old   # CPU, torchrun, gloo
    python perf/reference_memory.py --methods GRPO GRPO --lora 0 8   # full vs LoRA rank 8

Builds one random HF Llama (same weights for both runs; the tiny tokenizer), then runs 2
trainer steps per method, each in a fresh process, and prints side by side: the model
copies held (policy + reference), the bytes of weights held, the bytes the reference holds
(a copy; under LoRA (`--lora`, a rank per run, 0 = full fine-tuning) none, or a refreshed
snapshot of the adapters), and the process's peak memory (CUDA: max_memory_allocated; CPU:
peak resident set, ru_maxrss).

--setup: a GRPO trainer (held reference in bf16) is set up under `torchrun
--nproc-per-node 2` (gloo, CPU), once with this checkout's code and once with the
checkout at --baseline (e.g. `git worktree add /tmp/old ba1056e`: every rank loaded the
full weights and deep-copied the reference). Each rank reports the growth of its peak
resident set from the start of set-up to the first forward (weights in place, before
FSDP2's first all-gather) and to the end of set-up.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch


def build_model(out: Path, hidden: int, layers: int) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.tiny import TinyConfig, build_tokenizer

    tok = build_tokenizer(TinyConfig())
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 3,
                      num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=8,
                      max_position_embeddings=256, tie_word_embeddings=False,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def one_run(model: str, method: str, device: str, out: str, lora_rank: int = 0) -> dict:
    from trainer.config import parse_run_config
    from trainer.loop import Trainer

    cfg = parse_run_config({
        "run_id": method, "out_dir": out, "model": {
            "path": model, "device": device, "lora": {"rank": lora_rank} if lora_rank else None},
        "method": {"name": method}, "optim": {"steps": 2},
        "rollout": {"n": 4, "prompts_per_step": 4, "max_new_tokens": 16},
        "tracking": {"mlflow_uri": None, "progress": False},
    })
    trainer = Trainer(cfg)
    trainer.setup(track=False)
    for _ in range(2):
        trainer.step()
    ref = trainer.ref_schedule
    models = [trainer.model] + ([ref.model] if ref.model is not None else [])
    held = sum(p.numel() * p.element_size() for m in models for p in m.parameters())
    ref_bytes = (sum(p.numel() * p.element_size() for p in ref.model.parameters())
                 if ref.model is not None else
                 sum(t.numel() * t.element_size() for t in (ref.adapters or {}).values()))
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {"copies": len(models), "weights_bytes": held, "reference_bytes": ref_bytes,
            "peak_bytes": peak}


def setup_child(model: str, out: str) -> None:
    """One rank's set-up (run under torchrun): peak-RSS growth to the first forward and
    to the end of set-up, written to OUT/rank<R>.json."""
    from trainer import distributed
    from trainer.config import parse_run_config
    from trainer.logprobs import PolicyLogProbs
    from trainer.loop import Trainer

    def rss() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux

    marks: dict[str, int] = {}
    forward = PolicyLogProbs.forward

    def marking_forward(self, *args, **kwargs):  # records only, then the real forward
        marks.setdefault("first_forward", rss())
        return forward(self, *args, **kwargs)

    PolicyLogProbs.forward = marking_forward
    cfg = parse_run_config({
        "run_id": "setup", "out_dir": str(Path(out) / "run"),
        "model": {"path": model, "device": "cpu", "reference_dtype": "bfloat16"},
        "method": {"name": "GRPO"}, "rollout": {"n": 4, "prompts_per_step": 4},
        "tracking": {"mlflow_uri": None, "progress": False},
    })
    trainer = Trainer(cfg)
    start = rss()
    trainer.setup(track=False)
    rank = trainer.world.rank
    Path(out, f"rank{rank}.json").write_text(json.dumps(
        {"load": marks["first_forward"] - start, "setup": rss() - start}))
    distributed.shutdown()


def setup_memory(model: Path, work: Path, baseline: str | None) -> None:
    """--setup: per-rank set-up peaks, this checkout vs `baseline`, side by side."""
    import os

    here = str(Path(__file__).resolve().parents[1])
    runs = {"new": here} | ({"old": str(Path(baseline).resolve())} if baseline else {})
    results = {}
    for name, code in runs.items():
        out = work / f"setup-{name}"
        out.mkdir()
        env = {**os.environ, "PYTHONPATH": code, "OMP_NUM_THREADS": "1"}
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", __file__, "--setup-child", str(model),
                        str(out)], env=env, cwd=code, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        results[name] = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    mib = 2**20
    weights = (model / "model.safetensors").stat().st_size
    print(f"set-up at world size 2 (torchrun, gloo, CPU), GRPO with a bf16 reference; "
          f"full float32 weights {weights / mib:.0f} MiB")
    print(f"{'rank':<6}{'stage':<16}" + "".join(f"{n + ' MiB':>12}" for n in runs)
          + (f"{'new/old':>10}" if baseline else ""))
    for rank in (0, 1):
        for stage, label in (("load", "to 1st forward"), ("setup", "whole set-up")):
            row = [results[n][rank][stage] for n in runs]
            line = f"{rank:<6}{label:<16}" + "".join(f"{v / mib:>12.0f}" for v in row)
            print(line + (f"{row[0] / row[1]:>10.2f}" if baseline else ""))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--device", default="cpu")
    p.add_argument("--methods", nargs=2, default=["RPG-REINFORCE-URKL", "GRPO"])
    p.add_argument("--lora", nargs=2, type=int, default=[0, 0], metavar="RANK",
                   help="LoRA rank of each run (0 = full fine-tuning)")
    p.add_argument("--setup", action="store_true",
                   help="per-rank set-up memory at world size 2 (CPU) instead")
    p.add_argument("--baseline", help="with --setup: a checkout of the code to compare with")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)  # model method out rank
    p.add_argument("--setup-child", nargs=2, help=argparse.SUPPRESS)  # model out
    args = p.parse_args()
    if args.setup_child:
        setup_child(*args.setup_child)
        return
    if args.child:
        model, method, out, rank = args.child
        print(json.dumps(one_run(model, method, args.device, out, int(rank))))
        return
    work = Path(tempfile.mkdtemp(prefix="refmem_"))
    model = build_model(work / "model", args.hidden, args.layers)
    if args.setup:
        setup_memory(model, work, args.baseline)
        return
    results = {}
    for i, (method, rank) in enumerate(zip(args.methods, args.lora)):
        label = f"{method}{f' + LoRA r{rank}' if rank else ''}"
        cmd = [sys.executable, __file__, "--device", args.device, "--child", str(model), method,
               str(work / f"run{i}"), str(rank)]
        out = subprocess.check_output(cmd, text=True, stderr=subprocess.DEVNULL)
        results[label] = json.loads(out.strip().splitlines()[-1])
    mib = 2**20
    print(f"2 trainer steps, Llama hidden {args.hidden} x {args.layers} layers, {args.device}")
    print(f"{'run':<26}{'models held':>12}{'weights MiB':>14}{'reference MiB':>15}"
          f"{'peak MiB':>12}")
    for label, r in results.items():
        print(f"{label:<26}{r['copies']:>12}{r['weights_bytes'] / mib:>14.1f}"
              f"{r['reference_bytes'] / mib:>15.2f}{r['peak_bytes'] / mib:>12.1f}")
    (la, a), (lb, b) = results.items()
    print(f"peak ratio {lb} / {la}: {b['peak_bytes'] / a['peak_bytes']:.2f}x; weights held "
          f"ratio: {b['weights_bytes'] / a['weights_bytes']:.2f}x")


if __name__ == "__main__":
    main()
