"""Rank 0 works 8 s alone (as it does while the rollout worker samples), then every rank
enters a collective; launched with RPG_COLLECTIVE_TIMEOUT_S=3.

    torchrun --nproc-per-node 2 tests/distributed/wait_probe.py align|plain

`align`: the other ranks wait in `distributed.align` first, and the all-reduce that follows
succeeds. `plain`: they wait in the all-reduce itself, which gives up after 3 s: the
timeout the environment sets is the one the process group uses. Prints "sum N" on success.
"""

from __future__ import annotations

import sys
import time

import torch

from trainer import distributed


def main() -> None:
    world = distributed.init("cpu")
    if world.main:
        time.sleep(8)
    if sys.argv[1] == "align":
        distributed.align(world, "rank 0's 8 s of work")
    total = distributed.all_sum(torch.ones(1), world)
    print(f"sum {int(total)}", flush=True)
    distributed.shutdown()


if __name__ == "__main__":
    main()
