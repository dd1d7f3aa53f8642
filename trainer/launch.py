"""torchrun with the trainer's exit codes: 75 when the job was preempted, as `python -m trainer`.

    python -m trainer.launch --standalone --nproc-per-node 2 -m trainer --config run.yaml
    srun --ntasks-per-node 1 python -m trainer.launch --slurm --nproc-per-node 8 -m trainer ...

torchrun itself exits 1 whenever a worker exits non-zero or it is signalled, which would
hide "preempted, state saved, rerun to resume" (75) from a scheduler's retry logic. This
runs torchrun's own launcher and maps: every failed worker exited 75, or the launcher got
SIGTERM/SIGUSR1 (it forwards the signal; the workers save and exit 75) -> 75; anything
else keeps torchrun's behaviour. Arguments are torchrun's, unchanged, plus `--slurm`: one
launcher per node (srun), the rendezvous filled in from SLURM's environment: as many nodes
as the job has, this node's index, the job's first node as the c10d rendezvous host and the
job id as the rendezvous id (the same on every node, new on every requeue).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import tempfile

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run

from trainer.checkpoint import PREEMPTED_EXIT_CODE

PREEMPTION_SIGNALS = {"SIGTERM", "SIGUSR1"}
RDZV_PORT = 29500


def first_host(nodelist: str) -> str:
    """The first host of a SLURM hostlist: "gpu[07-09,12],cpu1" -> "gpu07" (what
    `scontrol show hostnames | head -1` prints, without needing SLURM's config)."""
    match = re.match(r"([^,[]+)(?:\[([^],-]+))?", nodelist.strip())
    if match is None:
        raise SystemExit(f"trainer.launch --slurm: cannot read SLURM_JOB_NODELIST={nodelist!r}")
    return match.group(1) + (match.group(2) or "")


def slurm_rendezvous(env: dict[str, str] | None = None) -> list[str]:
    """torchrun's multi-node flags for this SLURM step (one task per node)."""
    env = os.environ if env is None else env
    missing = [k for k in ("SLURM_JOB_ID", "SLURM_NNODES", "SLURM_NODEID", "SLURM_JOB_NODELIST")
               if k not in env]
    if missing:
        raise SystemExit(f"trainer.launch --slurm: {', '.join(missing)} not set; run it under "
                         "srun inside a SLURM job (one task per node)")
    head = first_host(env["SLURM_JOB_NODELIST"])
    print(f"[trainer.launch] node {env['SLURM_NODEID']} of {env['SLURM_NNODES']}: rendezvous "
          f"{head}:{RDZV_PORT}, id {env['SLURM_JOB_ID']}", file=sys.stderr, flush=True)
    return ["--nnodes", env["SLURM_NNODES"], "--node-rank", env["SLURM_NODEID"],
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{head}:{RDZV_PORT}",
            "--rdzv-id", env["SLURM_JOB_ID"]]


# How torchrun's agent ends the other workers once one has exited: SIGTERM, then SIGKILL.
STOPPED_BY_THE_AGENT = {-signal.SIGTERM, -signal.SIGKILL}


def preempted(codes: set[int]) -> bool:
    """The job was preempted with its state saved: some worker exited 75 and every other
    one did too or was stopped by the agent after it. A worker raises Preempted (75) only
    after the collective state save has returned on every rank, so one 75 means the state
    is whole; a peer still tearing down when the first 75 lands is SIGTERMed by the agent
    (seen under load: {75, -15})."""
    return PREEMPTED_EXIT_CODE in codes and codes <= {PREEMPTED_EXIT_CODE, *STOPPED_BY_THE_AGENT}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    launcher_args = argv[:argv.index("-m")] if "-m" in argv else argv
    if "--slurm" in launcher_args:
        argv.remove("--slurm")  # the first one: the launcher's, not the trainer's
        argv = slurm_rendezvous() + argv
    args = parse_args(argv)
    # torchrun keeps its workers' error files in a temporary folder it never removes: one of
    # ours, removed on every exit (the errors themselves are in the job's log)
    own_logs = None
    if args.log_dir is None:
        own_logs = args.log_dir = tempfile.mkdtemp(prefix="trainer-launch-")
    try:
        run(args)
    except ChildFailedError as e:
        if preempted({failure.exitcode for failure in e.failures.values()}):
            return PREEMPTED_EXIT_CODE
        raise
    except SignalException as e:
        if e.sigval.name in PREEMPTION_SIGNALS:
            print(f"[trainer.launch] {e.sigval.name}: workers saved their state; rerun to "
                  "resume", file=sys.stderr)
            return PREEMPTED_EXIT_CODE
        raise
    finally:
        if own_logs is not None:
            shutil.rmtree(own_logs, ignore_errors=True)
    return 0


if __name__ == "__main__":
    from common.console import line_buffered_stdout

    line_buffered_stdout()  # its log shows each line when printed
    sys.exit(main())
