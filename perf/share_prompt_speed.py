"""optim.share_prompt and optim.whole_groups on the default's batch: seconds and ratios.

    OMP_NUM_THREADS=1 python perf/share_prompt_speed.py [--model data/tiny-model] [--repeats 20]

One rollout of the default's shape (8 toy prompts x 8 samples, 32 new tokens, the shipped
tiny model), then, interleaved per repeat so both see the same machine load: the no-grad
log-probs of the 64 rows (pi_old's pass) and the forward + backward of one 16-row
mini-batch, rows shuffled one by one or two whole groups, each padded and with the prompt
shared. Prints the medians and each one's ratio to the padded, rows-shuffled baseline.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common import toy  # noqa: E402
from common.generation.hf import hf_generate  # noqa: E402
from common.prompts import build_prompt, encode_prompts  # noqa: E402
from trainer.logprobs import pack, response_logprobs  # noqa: E402


def rollout_batch(model, tokenizer):
    """The default's rollout batch: 8 prompts x 8 samples (group-major rows)."""
    texts = [build_prompt(p["problem"], "dapo", tokenizer) for p in toy.problems("train", 8, seed=0)]
    samples = hf_generate(model, tokenizer, texts, n=8, temperature=1.0, top_p=1.0,
                          max_new_tokens=32, seed=0)
    prompt_ids = encode_prompts(tokenizer, texts)
    return pack([prompt_ids[g] for g in range(8) for _ in range(8)],
                [s.token_ids for group in samples for s in group], tokenizer.pad_token_id)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(REPO / "data/tiny-model"))
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model)
    batch = rollout_batch(model, tokenizer)
    rows = torch.randperm(64, generator=torch.Generator().manual_seed(0))[:16]
    subs = {"rows shuffled": batch.rows(rows), "whole groups": batch.rows(torch.arange(16))}
    P, T = batch.prompt_len, batch.response_mask.shape[1]
    print(f"batch: 64 rows, prompt {P} + response {T} columns; torch threads "
          f"{torch.get_num_threads()}")

    def nograd(share: bool):
        with torch.no_grad():
            response_logprobs(model, batch, with_entropy=True, share_prompt=share)

    def update(sub, share: bool):
        model.zero_grad(set_to_none=True)
        logp, _ = response_logprobs(model, sub, share_prompt=share)
        logp.sum().backward()

    cases = {("log-probs, 64 rows", "padded"): lambda: nograd(False),
             ("log-probs, 64 rows", "shared"): lambda: nograd(True)}
    for name, sub in subs.items():
        for share in (False, True):
            cases[(f"fwd+bwd 16 rows, {name}", "shared" if share else "padded")] = \
                (lambda s=sub, sh=share: update(s, sh))
    times: dict[tuple[str, str], list[float]] = {k: [] for k in cases}
    for fn in cases.values():
        fn()  # warm-up
    for _ in range(a.repeats):
        for key, fn in cases.items():
            start = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - start)
    base = {"log-probs": statistics.median(times[("log-probs, 64 rows", "padded")]),
            "fwd+bwd": statistics.median(times[("fwd+bwd 16 rows, rows shuffled", "padded")])}
    for (what, how), ts in times.items():
        med = statistics.median(ts)
        ref = base["log-probs" if what.startswith("log-probs") else "fwd+bwd"]
        print(f"{what:32s} {how:7s} {med * 1e3:8.1f} ms   ratio {med / ref:.2f}")


if __name__ == "__main__":
    main()
