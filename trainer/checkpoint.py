"""Checkpoints (HF format, for evaluation), the resume state, and preemption handling.

Layout under the run directory:
    checkpoints/step_<N>/    model (safetensors) + tokenizer + run config, written to a temp
                             dir then renamed, so a visible step_<N> is always complete
    state/resume.pt          one resume state (weights, optimizer, scheduler, RNG states,
                             data position, reference, counters), temp file + os.replace
    DONE                     written last

Preemption: SIGTERM and SIGUSR1 (SLURM's warning signals) set a flag; the loop finishes
the step in flight, saves the resume state and exits with PREEMPTED_EXIT_CODE (75,
EX_TEMPFAIL: "try again"), so a scheduler can requeue and the next start resumes.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
from pathlib import Path

import numpy as np
import torch

PREEMPTED_EXIT_CODE = 75
STATE_FILE = "resume.pt"


def checkpoint_dir(out_dir: Path, step: int) -> Path:
    return Path(out_dir) / "checkpoints" / f"step_{step}"


def save_hf_checkpoint(model, tokenizer, path: Path, *, config_yaml: str,
                       dtype: torch.dtype | None = None, state_dict: dict | None = None) -> Path:
    """Save model + tokenizer in HF format atomically (temp dir, then rename).
    `state_dict`: the weights to write instead of `model`'s (gathered from shards)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    state = state_dict
    if dtype is not None:
        state = {k: v.detach().to(dtype) for k, v in (state or model.state_dict()).items()}
    model.save_pretrained(tmp, safe_serialization=True, state_dict=state)
    tokenizer.save_pretrained(tmp)
    (tmp / "run_config.yaml").write_text(config_yaml)
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)
    return path


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.random.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_state(out_dir: Path, payload: dict) -> Path:
    """Write the resume state atomically: a reader sees the old state or the new, never half."""
    state_dir = Path(out_dir) / "state"
    state_dir.mkdir(parents=True, exist_ok=True)
    final = state_dir / STATE_FILE
    tmp = state_dir / (STATE_FILE + ".tmp")
    torch.save({**payload, "rng": rng_state()}, tmp)
    os.replace(tmp, final)
    return final


def load_state(out_dir: Path) -> dict | None:
    """The resume state, or None when the run has none. Restores the global RNG states."""
    path = Path(out_dir) / "state" / STATE_FILE
    if not path.exists():
        return None
    # weights_only=False: the state holds Python RNG tuples and numpy arrays written by us.
    state = torch.load(path, map_location="cpu", weights_only=False)
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


class Preempted(SystemExit):
    """Raised after the resume state is saved; exits the process with code 75."""

    def __init__(self, signal_name: str, step: int) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)
        self.signal_name, self.step = signal_name, step
