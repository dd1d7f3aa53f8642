"""Set up a trainer (no step) at whatever world size this is launched with, and record
what set-up cost this rank.

    python tests/distributed/setup_probe.py CONFIG OUT
    torchrun --nproc-per-node 2 tests/distributed/setup_probe.py CONFIG OUT

Every rank writes OUT/rank<R>.json: the safetensors files transformers opened (its
`safe_open`, wrapped to record the path and then called as is) and the growth of the
process's peak resident set from the start of set-up to the first forward (the weights
in place, before FSDP2's first all-gather; `PolicyLogProbs.forward` wrapped to record
it; world size 1 makes no set-up forward: to the end of set-up). Rank 0 also writes OUT/tensors.pt: the full
policy and reference weights, and both models' log-probs on a fixed batch.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import torch
import transformers.modeling_utils as modeling_utils
from dist_update_script import fixed_batch

from trainer import distributed
from trainer.config import load_run_config
from trainer.logprobs import PolicyLogProbs
from trainer.loop import Trainer


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def record_opens() -> list[str]:
    opened: list[str] = []
    safe_open = modeling_utils.safe_open

    def recording(path, *args, **kwargs):
        opened.append(str(path))
        return safe_open(path, *args, **kwargs)

    modeling_utils.safe_open = recording
    return opened


def mark_first_forward() -> dict:
    marks: dict[str, int] = {}
    forward = PolicyLogProbs.forward

    def marking(self, *args, **kwargs):
        marks.setdefault("first_forward", peak_rss())
        return forward(self, *args, **kwargs)

    PolicyLogProbs.forward = marking
    return marks


def main(config: str, out: str) -> None:
    opened = record_opens()
    marks = mark_first_forward()
    trainer = Trainer(load_run_config(config))
    before = peak_rss()
    trainer.setup(track=False)
    world = trainer.world
    Path(out, f"rank{world.rank}.json").write_text(json.dumps(
        {"rank": world.rank, "opened": opened,
         "rss_growth_bytes": marks.get("first_forward", peak_rss()) - before}))
    batch, _, _ = fixed_batch(trainer.model.config.vocab_size, 8, 4, trainer.device)
    logp, _ = trainer.updater.logprobs_no_grad(trainer.policy, batch, with_entropy=False)
    ref_logp, _ = trainer.updater.logprobs_no_grad(trainer.ref_policy, batch, with_entropy=False)
    weights = distributed.model_state(trainer.policy)
    ref_weights = distributed.model_state(trainer.ref_policy)
    if world.main:
        torch.save({"logp": logp, "ref_logp": ref_logp, "weights": weights,
                    "ref_weights": ref_weights}, Path(out, "tensors.pt"))
    distributed.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
