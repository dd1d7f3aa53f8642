"""Padded token positions processed / real tokens, before vs after token-budget micro-batches.

    python perf/padding_waste.py                       # 512 x 16 responses, 8k cap
    python perf/padding_waste.py --rows 1024 --budgets 32768

Lengths are drawn from a lognormal (median ~1.5k response tokens, capped at 8k, prompts
100-400 tokens), the shape of a reasoning batch. "before": micro-batches of a fixed number
of rows in batch order, each padded to the whole batch's longest prompt + response (the
trainer before token budgets). "trimmed": the same fixed chunks, each trimmed to its own
longest row. "token budget": rows sorted by length and packed up to the budget
(`optim.max_tokens_per_micro_batch`). "padding-free": `optim.padding_free`, each micro-batch
one concatenated sequence (processed = real, by construction; the row shows how many
forward passes the budget needs). The counts come from `trainer.logprobs` itself.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from trainer.logprobs import micro_batches, pack, padded_tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=512, help="sequences in the batch")
    ap.add_argument("--micro", type=int, default=8, help="rows per fixed micro-batch")
    ap.add_argument("--budgets", type=int, nargs="+", default=[16384, 32768, 131072],
                    help="token budgets per micro-batch (config/paper.yaml uses 32768)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    responses = np.minimum(rng.lognormal(np.log(1500), 0.8, args.rows), 8192).astype(int)
    prompts = rng.integers(100, 400, args.rows)
    batch = pack([[1] * p for p in prompts], [[2] * t for t in responses], pad_id=0)
    rows = torch.arange(args.rows)
    real = int(prompts.sum() + responses.sum())
    fixed = micro_batches(batch, rows, args.micro)
    before = batch.input_ids.numel()
    trimmed = padded_tokens(batch, fixed)
    print(f"{args.rows} rows, real tokens {real:,}, response median "
          f"{int(np.median(responses))}, max {responses.max()}")
    print(f"{'layout':<28}{'processed / real':>18}")
    layouts = [("before (batch-wide padding)", before), ("fixed chunks, trimmed", trimmed)]
    layouts += [(f"token budget {b:,}", padded_tokens(batch, micro_batches(batch, rows, 10**9, b)))
                for b in args.budgets]
    for name, n in layouts:
        print(f"{name:<28}{n / real:>18.3f}")
    for b in args.budgets:
        groups = micro_batches(batch, rows, 10**9, b, padding_free=True)
        processed = sum(int(batch.rows(g).attention_mask.sum()) for g in groups)
        print(f"{f'padding-free {b:,}':<28}{processed / real:>18.3f}   ({len(groups)} forwards)")


if __name__ == "__main__":
    main()
