"""How much of a LoRA policy's move the vLLM sampler follows in bf16: merged push vs serving the
adapters (issue 46, item 10).

    python perf/lora_push_gap.py [--model data/tiny-model] [--scales 3e-5 1e-4 1e-3]
    python perf/lora_push_gap.py --mode adapter --scales 1e-4 --json    # one engine (tests)

For each scale s the adapters (rank 8, alpha 32, every linear layer: the presets') get
B = s * N(0, 1) (seeded; A as peft initialises it), so the policy W + (alpha / r) B A moves
a little from its base, as in a run's first steps. vLLM in bfloat16 (the LoRA presets'
sampler) is given the policy the way the trainer gives it (`merged`: bf16(W + s B A) under
the plain names, the old push; `adapter`: the base once, the adapters through vLLM's LoRA,
what `VLLMEngine.sync_weights` does now) and samples 8 responses to each of 16 toy prompts.
On those tokens the trainer's log-probs under bf16 autocast give pi_old (the policy) and
pi_base (adapters off); vLLM's own are mu. Printed per mode and scale:

- gap: mean |mu - pi_old| per sampled token (nats), the sampler/trainer mismatch;
- move: mean |pi_old - pi_base|, how far the adapters moved the policy;
- seen: the share of that move the sampler follows, <mu - pi_base, pi_old - pi_base> /
  |pi_old - pi_base|^2 over the tokens: 1 when mu moves as pi_old does, 0 when the sampler
  stayed on the base (bf16 rounding of the merged weight erased the update).

At the weights (no vLLM; the base in bf16, as the LoRA presets store it), per scale: the
share of the update s B A that the merged bf16 weight keeps, ||bf16(W + s B A) - W|| /
||s B A||, and the share bf16 adapters keep, 1 - ||s bf16(B) bf16(A) - s B A|| / ||s B A||.

Each mode runs in its own process (one vLLM per process, vLLM's rule); the parent prints
both side by side.

Below a move of ~1.5e-3 nats per token (bf16's sampler/trainer kernel gap on CPU) the gap
and "seen" columns are that noise and cannot tell the pushes apart; what a push delivers of
an early update is measured with float32 kernels on the bf16 base instead, by
tests/vllm/test_small_update.py (docs/performance.md "LoRA and the sampler").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
MODES = ("merged", "adapter")


def adapted(model_path: str, scale: float, dtype=None):
    """The tiny model with rank-8 adapters whose B = scale * N(0, 1) (seeded)."""
    from transformers import AutoModelForCausalLM

    from trainer import lora
    from trainer.config import LoraSettings

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).eval()
    lora.apply_lora(model, LoraSettings(rank=8, alpha=32.0))
    set_scale(model, scale)
    return model


def set_scale(model, scale: float) -> None:
    import torch

    from trainer import lora

    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in lora.adapter_parameters(model).values():
            if p.ndim == 2 and p.shape[1] == 8:  # lora_B: (out, r)
                p.copy_(scale * torch.randn(p.shape, generator=gen))


def weights_kept(model_path: str, scales: list[float]) -> dict[float, tuple[float, float]]:
    """scale -> (share of s B A a bf16 merge keeps, share bf16 adapters keep), see doc."""
    import torch

    from trainer import lora

    out = {}
    torch.manual_seed(0)
    torch.set_grad_enabled(False)
    for scale in scales:
        model = adapted(model_path, scale, dtype=torch.bfloat16)
        delta2 = merged2 = served2 = 0.0
        for layer in lora.lora_layers(model):
            w = layer.base_layer.weight.float()
            a, b = layer.lora_A["default"].weight.float(), layer.lora_B["default"].weight.float()
            delta = layer.scaling["default"] * b @ a
            merged = (w + delta).to(torch.bfloat16).float() - w
            served = layer.scaling["default"] * (b.bfloat16().float() @ a.bfloat16().float())
            delta2 += float(delta.pow(2).sum())
            merged2 += float(merged.pow(2).sum())
            served2 += float((served - delta).pow(2).sum())
        out[scale] = ((merged2 / delta2) ** 0.5, 1 - (served2 / delta2) ** 0.5)
    return out


def measure(model_path: str, mode: str, scales: list[float]) -> list[dict]:
    import torch
    from transformers import AutoTokenizer

    from common.generation.base import model_weights
    from common.generation.vllm import VLLMEngine
    from common.prompts import build_prompt, encode_prompts
    from common.toy import problems
    from trainer import lora
    from trainer.logprobs import pack, response_logprobs

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_path)
    model = adapted(model_path, 0.0)
    engine = VLLMEngine(model_path, tok, dtype="bfloat16", seed=0,
                        lora_rank=8 if mode == "adapter" else None)
    texts = [build_prompt(p["problem"], "dapo", tok) for p in problems("train", 16, seed=5)]
    prompt_ids = encode_prompts(tok, texts)
    rows = []
    for scale in scales:
        set_scale(model, scale)
        if mode == "adapter":
            engine.sync_weights(model)
        else:
            engine.load_weights(model_weights(model))
        samples = engine.generate(texts, n=8, temperature=1.0, top_p=1.0, max_new_tokens=24,
                                  seed=2)
        flat = [(prompt_ids[i], s) for i, group in enumerate(samples) for s in group]
        batch = pack([p for p, _ in flat], [list(s.token_ids) for _, s in flat], tok.pad_token_id)
        mu = torch.zeros(batch.response_mask.shape)
        for i, (_, s) in enumerate(flat):
            mu[i, : len(s.logprobs)] = torch.tensor(s.logprobs)
        mask = batch.response_mask.bool()
        with torch.no_grad():
            old = response_logprobs(model, batch, autocast=torch.bfloat16)[0]
            with lora.adapters_off(model):
                base = response_logprobs(model, batch, autocast=torch.bfloat16)[0]
        move, seen = (old - base)[mask].double(), (mu - base)[mask].double()
        rows.append({"mode": mode, "scale": scale, "tokens": int(mask.sum()),
                     "gap": float((mu - old)[mask].abs().mean()),
                     "move": float(move.abs().mean()),
                     "seen": float((seen * move).sum() / (move * move).sum())})
    engine.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=str(REPO / "data" / "tiny-model"))
    p.add_argument("--scales", type=float, nargs="+", default=[3e-5, 1e-4, 1e-3])
    p.add_argument("--mode", choices=MODES, default=None, help="one mode, in this process")
    p.add_argument("--json", action="store_true", help="one JSON line per row")
    args = p.parse_args(argv)
    if args.mode:
        rows = measure(args.model, args.mode, args.scales)
    else:
        rows = []
        for mode in MODES:
            cmd = [sys.executable, __file__, "--mode", mode, "--json", "--model", args.model,
                   "--scales", *map(str, args.scales)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            rows += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    kept = weights_kept(args.model, args.scales)
    print(f"{'scale':>8s}  {'mode':8s} {'tokens':>6s}  {'move':>9s}  {'gap':>9s}  {'seen':>6s}  "
          f"{'update kept at the weights':>27s}")
    for row in sorted(rows, key=lambda r: (r["scale"], r["mode"])):
        share = kept[row["scale"]][0 if row["mode"] == "merged" else 1]
        print(f"{row['scale']:8.0e}  {row['mode']:8s} {row['tokens']:6d}  {row['move']:9.2e}  "
              f"{row['gap']:9.2e}  {row['seen']:6.2f}  {100 * share:26.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
