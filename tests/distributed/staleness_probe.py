"""Train a few steps under `rollout.staleness: k` at whatever world size this is launched
with, and check the sharded lag against the trained weights after every step.

    torchrun --nproc-per-node 2 tests/distributed/staleness_probe.py CONFIG OUT

Before each step every rank gathers the policy's whole weights (`distributed.model_state`,
a collective); after it, the lag's generation copy, gathered whole (`WeightLag.full_weights`),
must equal the weights of the step it says it holds (`sampling_step`): theta_{max(t-k, 0)}
after t pushes, copied slice by slice on each rank. Rank 0 writes OUT/lag.json: per step,
the step the copy holds and whether every tensor matched exactly.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from trainer import distributed
from trainer.config import load_run_config
from trainer.loop import Trainer


def main() -> None:
    cfg = load_run_config(sys.argv[1])
    out = Path(sys.argv[2])
    trainer = Trainer(cfg)
    trainer.setup(track=False)
    keep = trainer.world.main
    history = [distributed.model_state(trainer.policy)]  # theta_0, whole (rank 0)
    rows = []
    for _ in range(cfg.optim.steps):
        trainer.step()
        history.append(distributed.model_state(trainer.policy))
        held = trainer.lag.sampling_step(trainer.global_step)
        lag = trainer.lag.full_weights(keep=keep)
        if keep:
            expected = {k.removeprefix("model."): v for k, v in history[held].items()}
            rows.append({"step": trainer.global_step, "holds": held,
                         "names": sorted(lag) == sorted(expected),
                         "equal": all(torch.equal(lag[k], expected[k]) for k in lag),
                         "moved": any(not torch.equal(lag[k], history[-1][f"model.{k}"])
                                      for k in lag)})
    trainer.engine.engine.close()
    if keep:
        out.mkdir(parents=True, exist_ok=True)
        (out / "lag.json").write_text(json.dumps(rows))
    distributed.shutdown()


if __name__ == "__main__":
    main()
