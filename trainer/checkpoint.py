"""Checkpoints (HF format, for evaluation), the resume state, and preemption handling.

What it writes in the run directory (paths from `common.layout.RunDir`):
    checkpoint(N)            model (safetensors) + tokenizer + run config, written to
                             checkpoint_tmp(N) then renamed, so a visible step_<N> is complete
    state_file               the resume state's small part (RNG states, data position,
                             reference schedule, counters) and the name of its tensors
                             folder; temp file + os.replace, the commit point; tensors and
                             plain values only, loaded with weights_only=True
    state_tensors(N)         the weights and optimizer states, sharded: each rank writes its
                             own shards (torch.distributed.checkpoint), any world size loads;
                             under rollout.staleness also the lagged generation copy and its
                             queued snapshots (trainer.staleness, one process only)

A save that fills the disk (ENOSPC mid-write) removes its partial files and raises
`DiskFullError`, one line with the path, the bytes needed and the bytes free: whatever was
saved before (the previous resume state, earlier checkpoints) is untouched, so rerunning the
same command after freeing space resumes from the previous state.

Preemption: SIGTERM and SIGUSR1 (SLURM's warning signals) set a flag; the loop finishes
the step in flight, saves the resume state and exits with PREEMPTED_EXIT_CODE (75,
EX_TEMPFAIL: "try again"), so a scheduler can requeue and the next start resumes.
"""

from __future__ import annotations

import errno
import os
import pickle
import random
import re
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch.distributed.checkpoint.api import CheckpointException

from common.layout import CHECKPOINT_CONFIG, RunDir
from trainer import distributed

PREEMPTED_EXIT_CODE = 75
DISK_FULL_EXIT_CODE = 74  # EX_IOERR
# Errors a write can end in when the disk is full: OSError(ENOSPC) from Python's own writes,
# RuntimeError from torch's zip writer ("unexpected pos ..."), which DCP wraps in its
# CheckpointException (a BaseException).
_WRITE_ERRORS = (OSError, RuntimeError, CheckpointException)


class DiskFullError(OSError):
    """The disk filled while a save was written; the partial files are removed."""


def tensor_bytes(obj) -> int:
    """Bytes of the tensors in a nested dict/list/tuple (a sharded tensor: this rank's shard)."""
    if isinstance(obj, torch.Tensor):
        local = obj.to_local() if hasattr(obj, "to_local") else obj  # DTensor under FSDP2
        return local.numel() * local.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def _no_space(exc: BaseException) -> bool:
    """ENOSPC/EDQUOT anywhere in the exception's chain (or in DCP's per-rank failures)."""
    seen: list[BaseException] = [exc]
    while seen:
        e = seen.pop()
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(e, CheckpointException):
            seen += [f[0] if isinstance(f, tuple) else f for f in e.failures.values()]
        seen += [c for c in (e.__cause__, e.__context__) if c is not None]
    return False


@contextmanager
def disk_full_is_one_error(partial: Path, needed: int, what: str, kept: str) -> Iterator[None]:
    """Turn a write that ran out of space into `DiskFullError`: remove `partial` (the
    half-written file or folder, so the space comes back), then say what was being saved,
    the bytes it needs and the bytes free, and what is still whole (`kept`). Other errors
    pass unchanged."""
    try:
        yield
    except _WRITE_ERRORS as exc:
        if partial.is_dir():
            shutil.rmtree(partial, ignore_errors=True)
        else:
            partial.unlink(missing_ok=True)
        if isinstance(exc, DiskFullError):  # said by an inner save already
            raise
        free = shutil.disk_usage(partial.parent).free
        if not (_no_space(exc) or free < needed):
            raise
        raise DiskFullError(
            f"{partial}: the disk is full: {what} needs about {needed:,} bytes, "
            f"{free:,} are free on {partial.parent}; {kept}; free space (or move the run "
            "to a larger disk) and rerun the same command") from None


def save_hf_checkpoint(model, tokenizer, path: Path, *, config_yaml: str,
                       dtype: torch.dtype | None = None, state_dict: dict | None = None,
                       extra=None) -> Path:
    """Save model + tokenizer in HF format atomically (temp dir, then rename).
    `state_dict`: the weights to write instead of `model`'s (gathered from shards, or LoRA's
    merged ones); `extra(tmp_dir)`: writes more files into it before the rename (adapters)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")  # RunDir.checkpoint_tmp
    shutil.rmtree(tmp, ignore_errors=True)
    state = state_dict
    if dtype is not None:
        state = {k: v.detach().to(dtype) for k, v in (state or model.state_dict()).items()}
    needed = tensor_bytes(state if state is not None else model.state_dict())
    with disk_full_is_one_error(tmp, needed, f"the checkpoint {path.name}",
                                "the checkpoints and resume state saved before are whole"):
        model.save_pretrained(tmp, safe_serialization=True, state_dict=state)
        tokenizer.save_pretrained(tmp)
        (tmp / CHECKPOINT_CONFIG).write_text(config_yaml)
        if extra is not None:
            extra(tmp)
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)
    return path


class UnsafeStateError(ValueError):
    """A resume state that would need arbitrary unpickling to load: refused, never executed."""


def rng_state() -> dict:
    """The global RNG states as tensors and plain values, so the state loads with weights_only.

    Python's Mersenne Twister state (625 words < 2**32) and numpy's key (624 uint32 words) go
    into int64 tensors; torch's (and CUDA's) states are already byte tensors.
    """
    version, internal, gauss_next = random.getstate()
    np_state = np.random.get_state(legacy=False)
    state = {
        "python": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64),
                   "gauss_next": gauss_next},
        "numpy": {"bit_generator": np_state["bit_generator"],
                  "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                  "pos": int(np_state["state"]["pos"]),
                  "has_gauss": int(np_state["has_gauss"]), "gauss": float(np_state["gauss"])},
        "torch": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore the global RNG states written by `rng_state`."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"].tolist()), py["gauss_next"]))
    npy = state["numpy"]
    np.random.set_state({
        "bit_generator": npy["bit_generator"],
        "state": {"key": npy["key"].numpy().astype(np.uint32), "pos": npy["pos"]},
        "has_gauss": npy["has_gauss"], "gauss": npy["gauss"],
    })
    torch.random.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_state(out_dir: Path, payload: dict) -> Path:
    """Write the resume state atomically: a reader sees the old state or the new, never half.

    The payload must hold only tensors, numbers, strings, None, and dicts/lists/tuples of
    them (what `torch.load(..., weights_only=True)` accepts); `load_state` refuses anything
    else, so a state that could not be loaded back is never written.
    """
    final = RunDir(out_dir).state_file
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(final.name + ".tmp")
    state = {**payload, "rng": rng_state()}
    with disk_full_is_one_error(tmp, tensor_bytes(state), "the resume state",
                                f"{final} (if any) is the previous state, whole"):
        torch.save(state, tmp)
    os.replace(tmp, final)
    return final


def save_sharded_state(out_dir: Path, payload: dict, tensors: dict, *, step: int,
                       main: bool, barrier) -> Path:
    """The resume state of a (possibly sharded) run: every rank writes its own shards of
    `tensors` into `state/tensors_step_<N>/` (`trainer.sharded_state`), then rank 0 writes
    `payload` with a pointer to them as `state/resume.pt`, the commit point: a crash
    before it leaves the previous state whole. Older tensor folders are removed after.
    `barrier()` waits for every rank (a no-op at world size 1)."""
    from trainer import sharded_state

    run = RunDir(out_dir)
    folder = run.state_tensors(step)
    if main:
        shutil.rmtree(folder, ignore_errors=True)  # a half-written save of this step
        folder.parent.mkdir(parents=True, exist_ok=True)
    barrier()
    previous = sorted(f.name for f in run.state_dir.glob("tensors_*") if f != folder)
    kept = (f"the previous resume state ({run.state_file}, {previous[-1]}) is whole and "
            "a rerun resumes from it" if run.state_file.exists() and previous else
            "there was no earlier resume state: a rerun starts the run over")
    with disk_full_is_one_error(folder, tensor_bytes(tensors),
                                f"the resume state of step {step}", kept):
        sharded_state.save(folder, tensors)
    barrier()
    if main:
        with disk_full_is_one_error(folder, tensor_bytes(tensors),
                                    f"the resume state of step {step}", kept):
            save_state(out_dir, {**payload, "tensors": folder.name})
        for old in run.state_dir.glob("tensors_*"):
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)
    barrier()
    return folder


def load_sharded_state(out_dir: Path, meta: dict, templates: dict) -> None:
    """Fill `templates` (this world size's sharded state dicts) from the folder `meta`
    (the loaded `resume.pt`) points at; any world size loads any other's save."""
    from trainer import sharded_state

    folder = RunDir(out_dir).state_dir / meta["tensors"]
    try:
        sharded_state.load(folder, templates)
    except sharded_state.UnsafeMetadataError as exc:
        raise UnsafeStateError(
            f"{folder}: refused to load this resume state ({exc}; resume files are data, "
            "and unpickling anything else could run code); if you did not expect this file, "
            f"delete {folder.parent} and rerun to start the run over from step 0") from None


def remove_state(out_dir: Path) -> None:
    """Drop the resume state (pointer first, so a crash leaves no half state)."""
    run = RunDir(out_dir)
    run.state_file.unlink(missing_ok=True)
    for folder in run.state_dir.glob("tensors_*"):
        shutil.rmtree(folder, ignore_errors=True)


def load_state(out_dir: Path) -> dict | None:
    """The resume state, or None when the run has none. Restores the global RNG states.

    The file is data: it loads with `weights_only=True` (tensors and plain values), so a
    state planted by someone else (a shared scratch directory, a copied run) cannot run
    code. A file that needs any other unpickling is refused with `UnsafeStateError`.
    """
    path = RunDir(out_dir).state_file
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        what = f"it needs {found.group(1)}" if found else "it holds more than tensors and plain values"
        raise UnsafeStateError(
            f"{path}: refused to load this resume state ({what}; resume files are data, and "
            "unpickling anything else could run code); if you did not expect this file, "
            f"delete {path.parent} and rerun to start the run over from step 0") from None
    set_rng_state(state["rng"])
    return state


class PreemptionFlag:
    """Installs SIGTERM/SIGUSR1 handlers that record the signal; restores the old ones on exit."""

    SIGNALS = ("SIGTERM", "SIGUSR1")

    def __init__(self) -> None:
        self.received: str | None = None
        self._old: dict = {}

    def _handler(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name
        distributed.STOPPING.set()  # a peer silent from now on is a dead one

    def __enter__(self) -> PreemptionFlag:
        for name in self.SIGNALS:
            sig = getattr(signal, name, None)
            if sig is None:
                continue
            try:
                self._old[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread: signals cannot be handled here
                pass
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


# Exit codes of a signal that arrives outside the steps (set-up, teardown), where there is
# nothing to save: the state saved last, if any, is whole, so SLURM's signals still mean
# "preempted, rerun to resume" (75); a hang-up and a Ctrl-C keep the shell's 128 + n.
SIGNAL_EXIT_CODES = {"SIGTERM": PREEMPTED_EXIT_CODE, "SIGUSR1": PREEMPTED_EXIT_CODE,
                     "SIGHUP": 128 + signal.SIGHUP, "SIGINT": 128 + signal.SIGINT}


class Stopped(BaseException):
    """A signal outside the steps: raised where the process is, so every `finally` on the
    way out runs (the rollout worker is ended, the hand-off removed)."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(f"{signal_name} received outside a training step; nothing was lost: "
                         "the resume state saved last (if any) is whole, rerun to resume")
        self.signal_name = signal_name
        self.exit_code = SIGNAL_EXIT_CODES[signal_name]


@contextmanager
def _handled(names: tuple[str, ...], handler) -> Iterator[None]:
    """`handler` for the signals `names` during the block (where this platform has them and
    this is the main thread); the previous handlers after."""
    old = {}
    for name in names:
        sig = getattr(signal, name, None)
        if sig is not None:
            try:
                old[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread
                pass
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


def signals_stop_the_run():
    """SIGTERM, SIGUSR1 and SIGHUP raise `Stopped` (SIGINT raises KeyboardInterrupt already);
    inside the loop PreemptionFlag takes SIGTERM and SIGUSR1 over, to save first. Without
    this a signal during set-up ends the process with no `finally` run, and a SIGTERMed
    trainer's rollout worker (which ignores SIGTERM) would be joined forever at exit."""
    def stop(signum, frame):
        raise Stopped(signal.Signals(signum).name)

    return _handled(("SIGTERM", "SIGUSR1", "SIGHUP"), stop)


def stop_signals_ignored():
    """SIGINT, SIGTERM, SIGUSR1 and SIGHUP ignored for the block: the way out (ending the
    rollout worker, removing its files) runs whole, even when torchrun's SIGTERM to the
    survivors of a dead rank, or a second Ctrl-C, arrives in the middle of it."""
    return _handled(("SIGINT", "SIGTERM", "SIGUSR1", "SIGHUP"), signal.SIG_IGN)


class Preempted(SystemExit):
    """Raised after the resume state is saved; exits the process with code 75."""

    def __init__(self, signal_name: str, step: int) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)
        self.signal_name, self.step = signal_name, step
