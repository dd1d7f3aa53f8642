"""torchrun with the trainer's exit codes: 75 when the job was preempted, as `python -m trainer`.

    python -m trainer.launch --standalone --nproc-per-node 2 -m trainer --config run.yaml

torchrun itself exits 1 whenever a worker exits non-zero or it is signalled, which would
hide "preempted, state saved, rerun to resume" (75) from a scheduler's retry logic. This
runs torchrun's own launcher and maps: every failed worker exited 75, or the launcher got
SIGTERM/SIGUSR1 (it forwards the signal; the workers save and exit 75) -> 75; anything
else keeps torchrun's behaviour. Arguments are torchrun's, unchanged.
"""

from __future__ import annotations

import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run

from trainer.checkpoint import PREEMPTED_EXIT_CODE

PREEMPTION_SIGNALS = {"SIGTERM", "SIGUSR1"}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run(args)
    except ChildFailedError as e:
        codes = {failure.exitcode for failure in e.failures.values()}
        if codes == {PREEMPTED_EXIT_CODE}:
            return PREEMPTED_EXIT_CODE
        raise
    except SignalException as e:
        if e.sigval.name in PREEMPTION_SIGNALS:
            print(f"[trainer.launch] {e.sigval.name}: workers saved their state; rerun to "
                  "resume", file=sys.stderr)
            return PREEMPTED_EXIT_CODE
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
