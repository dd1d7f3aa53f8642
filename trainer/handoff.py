"""How the trainer hands weights to the rollout worker (trainer.async_rollout): one file a
push, placed where it fits, and a fingerprint that says by content which weights arrived.

    hand_off = HandOff(run_dir)              # /dev/shm when a push fits there, else the run
    path = hand_off.write(state, step)       # one safetensors file (one descriptor, one copy)
    state = read(path)                       # the worker: loads it and removes the file
    fingerprint(state)                       # the same string on both sides iff same weights
    hand_off.close()                         # nothing of ours left in /dev/shm or the run

Why one file: torch.multiprocessing shares each tensor through a descriptor of its own
(about two per tensor while a push is in flight), so a 900-tensor state overruns a 1024-file
limit, and /dev/shm holds the whole state twice at peak. A safetensors file costs one
descriptor and one copy, is read by the worker through a memory map, and is removed by the
worker once loaded (by `close` when the worker died first).

Where: /dev/shm (memory, no disk write) when its free space holds the push with room to
spare, else the run folder's `rollout-handoff/`, said once in one warning. A folder in
/dev/shm is named after the trainer's pid (`rpg-handoff-<pid>`), so a start removes the
folders of trainers that are gone (one killed with SIGKILL cannot remove its own).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from common.processes import pid_alive

SHM = Path("/dev/shm")
SHM_PREFIX = "rpg-handoff-"
SPILL_DIR = "rollout-handoff"  # under the run folder
HEADROOM = 1.25  # /dev/shm must hold a push this many times over (others use it too)
FINGERPRINT_POINTS = 256  # elements read per tensor


def fingerprint(state: dict[str, torch.Tensor]) -> str:
    """A digest of the weights by content: every tensor's name, shape, dtype and
    FINGERPRINT_POINTS elements spread evenly over it (exact bytes, so any change of those
    elements, however small, changes it). Cheap: milliseconds for an 8B state."""
    digest = hashlib.blake2b(digest_size=12)
    for name in sorted(state):
        t = state[name].detach()
        flat = t.reshape(-1)
        if flat.numel():
            idx = torch.linspace(0, flat.numel() - 1, min(flat.numel(), FINGERPRINT_POINTS))
            flat = flat[idx.round().long().to(flat.device)]
        digest.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        digest.update(flat.to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


def state_bytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def remove_orphans(shm: Path = SHM) -> list[Path]:
    """Remove the /dev/shm folders of trainers that no longer run; returns them."""
    removed = []
    for folder in shm.glob(f"{SHM_PREFIX}*") if shm.is_dir() else ():
        pid = folder.name.removeprefix(SHM_PREFIX)
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


class HandOff:
    """The trainer's side: where each push goes (decided at the first, by its size)."""

    def __init__(self, run_dir: str | Path, *, shm: Path = SHM) -> None:
        self.run_dir, self.shm = Path(run_dir), shm
        self.folder: Path | None = None
        self.warning: str | None = None  # why the pushes spill to the run folder, if they do
        remove_orphans(shm)
        shutil.rmtree(self.run_dir / SPILL_DIR, ignore_errors=True)  # a killed run's

    def _place(self, nbytes: int) -> Path:
        folder = self.shm / f"{SHM_PREFIX}{os.getpid()}"
        free = shutil.disk_usage(self.shm).free if self.shm.is_dir() else 0
        if free >= HEADROOM * nbytes:
            try:
                folder.mkdir(exist_ok=True)
                return folder
            except OSError as e:
                reason = f"{self.shm} refused a folder ({e.strerror})"
        else:
            reason = (f"{self.shm} has {free / 2**20:,.0f} MiB free for a "
                      f"{nbytes / 2**20:,.0f} MiB push")
        folder = self.run_dir / SPILL_DIR
        folder.mkdir(parents=True, exist_ok=True)
        self.warning = (f"[trainer] warning: {reason}: weights go to the rollout worker "
                        f"through {folder} (disk) instead; give the job a larger /dev/shm "
                        "(docker --shm-size, or a tmpfs) to keep them in memory")
        print(self.warning, flush=True)
        return folder

    def write(self, state: dict[str, torch.Tensor], step: int) -> Path:
        """One safetensors file with `state` (CPU tensors), for the worker to read."""
        if self.folder is None:
            self.folder = self._place(state_bytes(state))
        path = self.folder / f"weights_step_{step}.safetensors"
        tmp = path.with_suffix(".tmp")
        # safetensors refuses tensors that share storage (tied weights): each gets its own
        seen: set[int] = set()
        flat = {}
        for name, t in state.items():
            t = t.detach().contiguous()
            if t.untyped_storage().data_ptr() in seen:
                t = t.clone()
            seen.add(t.untyped_storage().data_ptr())
            flat[name] = t
        save_file(flat, str(tmp))
        os.replace(tmp, path)
        return path

    def close(self) -> None:
        """Remove every push not yet read (the worker removes the ones it loaded)."""
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def read(path: str | Path) -> dict[str, torch.Tensor]:
    """The worker's side: the pushed weights, and the file removed (its pages stay readable
    through the loaded tensors until they are dropped)."""
    state = load_file(str(path))
    Path(path).unlink(missing_ok=True)
    return state
