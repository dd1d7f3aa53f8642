"""Process-level settings shared by the trainer's entry points (CPU speed, devices, dtypes)."""

from __future__ import annotations

import ctypes
import sys

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def tune_cpu_runtime() -> None:
    """Keep freed memory in the heap and flush denormals.

    Why: glibc returns large freed blocks to the OS, so every step page-faults its
    activations in again; on the small VMs this project targets that made a tiny-model
    SFT step ~10x slower (0.3 s -> 3 s, measured). Denormal floats in Adam's second moment
    hit a slow CPU path. Both settings are no-ops for results. Linux/glibc only; silent
    elsewhere.
    """
    torch.set_flush_denormal(True)
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3  # <malloc.h>
    libc.mallopt(m_mmap_threshold, 1 << 30)
    libc.mallopt(m_trim_threshold, 2**31 - 1)
    libc.mallopt(m_top_pad, 256 << 20)


def resolve_device(device: str) -> torch.device:
    """"auto" -> cuda when available, else cpu; "cuda" without a GPU is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("model.device=cuda but torch sees no CUDA device")
    return torch.device(device)


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a config name (float32, bfloat16, float16)."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype={name!r}; choose one of {sorted(_DTYPES)}") from None


def autocast_dtype(compute_dtype: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for forward passes, or None for plain float32."""
    if compute_dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return None if compute_dtype == "float32" else torch_dtype(compute_dtype)
