"""The hf engine's generation time, shared prefill vs transformers `generate`, interleaved.

    OMP_NUM_THREADS=1 python perf/hf_generate_speed.py [--model data/tiny-model] [--repeats 5]

Two shapes of the default (config/default.yaml): a rollout (8 toy prompts x n=8, 32 new
tokens, one call) and an evaluation call (16 prompts x n=4, 48 new tokens, 64 rows). Each
repeat times `hf_generate` (one prefill per distinct prompt) and the same rows through
`model.generate` (every row prefilled) back to back, so both see the same machine load;
prints the median seconds of each and the ratio new / old.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from common.generation.hf import (
    checkpoint_defaults_ignored,
    hf_generate,
    sampling_generation_config,
)
from common.prompts import adds_special_tokens, build_prompt
from common.toy import problems

REPO = Path(__file__).resolve().parents[1]


def generate_every_row(model, tok, prompts, *, n, max_new_tokens, seed, batch_size):
    """The previous hf_generate: `model.generate` on all rows, `batch_size` rows a call."""
    config = sampling_generation_config(model, tok, temperature=1.0, top_p=1.0,
                                        max_new_tokens=max_new_tokens)
    rows = [p for p in prompts for _ in range(n)]
    tok.padding_side = "left"
    with torch.random.fork_rng(), torch.no_grad(), checkpoint_defaults_ignored(model):
        torch.manual_seed(seed)
        for start in range(0, len(rows), batch_size):
            enc = tok(rows[start : start + batch_size], return_tensors="pt", padding=True,
                      add_special_tokens=adds_special_tokens(tok))
            model.generate(**enc, generation_config=config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(REPO / "data" / "tiny-model"))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    tok = AutoTokenizer.from_pretrained(args.model)
    shapes = {"rollout 8x8, 32 tokens": (8, 8, 32, 256),
              "eval 16x4, 48 tokens": (16, 4, 48, 64)}
    for name, (n_prompts, n, max_new, batch) in shapes.items():
        prompts = [build_prompt(p["problem"], "dapo", tok) for p in problems("train", n_prompts)]
        new, old = [], []
        for seed in range(args.repeats):
            t = time.perf_counter()
            hf_generate(model, tok, prompts, n=n, temperature=1.0, top_p=1.0,
                        max_new_tokens=max_new, seed=seed, batch_size=batch)
            new.append(time.perf_counter() - t)
            t = time.perf_counter()
            generate_every_row(model, tok, prompts, n=n, max_new_tokens=max_new, seed=seed,
                               batch_size=batch)
            old.append(time.perf_counter() - t)
        a, b = statistics.median(new), statistics.median(old)
        print(f"{name}: shared prefill {a:.3f} s, generate {b:.3f} s, ratio {a / b:.2f}")


if __name__ == "__main__":
    main()
