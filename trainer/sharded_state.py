"""The resume state's tensors, saved sharded with `torch.distributed.checkpoint` (DCP).

Under FSDP2 every rank writes only its own shards of the weights and AdamW states, in
parallel, so no rank ever holds the full model (60 GiB of fp32 weights + optimizer for a
4B policy). DCP records each shard's place in the full tensor, so a state saved at world
size 2 loads at world size 1 (plain tensors) or 4 (other shards): resharding on load.
At world size 1 (no process group) the same calls save and load in-process.

    save(directory, {"model": ..., "optimizer": ...})    # a collective under FSDP2
    load(directory, templates)                           # fills `templates` in place

Tensors come back with `torch.load(weights_only=True)` (DCP's own reader); DCP's
`.metadata` file is a pickle, so it is read here with an unpickler that accepts only DCP's
metadata classes and refuses anything else before it can run code.
"""

from __future__ import annotations

import enum
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

# Modules whose classes may appear in DCP metadata (dataclasses describing shards, dtypes,
# sizes). Everything else, e.g. `os.system` or `pathlib.Path.write_text`, is refused.
_METADATA_MODULES = ("torch.distributed.checkpoint.", "torch.distributed._shard.")
_TORCH_NAMES = {"Size", "device", "layout", "memory_format"}
_OTHER_NAMES = {("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
                ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "Path")}


class UnsafeMetadataError(pickle.UnpicklingError):
    """A `.metadata` file that names something other than DCP's metadata classes."""


def _enum_member(cls: Any, name: str) -> enum.Enum:
    """What `getattr` may do in metadata: name a member of an allowed Enum. Some Python 3.11
    releases (Debian bookworm's 3.11.2; 3.11.7 pickles by value) pickle enum members, DCP's
    `_MEM_FORMAT_ENCODING` among them, as `getattr(cls, name)`; a plain getattr would hand
    out any attribute (`Path.write_text` ...), so only members pass."""
    if isinstance(cls, type) and issubclass(cls, enum.Enum) and name in cls.__members__:
        return cls[name]
    raise UnsafeMetadataError(f"Unsupported global: GLOBAL builtins.getattr({cls!r}, {name!r})")


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        allowed = (module.startswith(_METADATA_MODULES)
                   or (module == "torch" and (name in _TORCH_NAMES
                                              or isinstance(getattr(torch, name, None),
                                                            torch.dtype)))
                   or (module, name) in _OTHER_NAMES)
        if not allowed:
            raise UnsafeMetadataError(f"Unsupported global: GLOBAL {module}.{name}")
        return super().find_class(module, name)


class _SafeReader(FileSystemReader):
    """DCP's file reader, with the metadata read by the allow-list unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self.path) / ".metadata"
        with open(path, "rb") as handle:
            metadata = _MetadataUnpickler(handle).load()
        if not isinstance(metadata, Metadata):
            raise UnsafeMetadataError(f"{path} does not hold DCP metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def save(directory: Path, tensors: dict) -> None:
    """Write `tensors` (nested dicts of tensors/DTensors) under `directory`; every rank
    calls it with its own shards."""
    dcp.save(tensors, storage_writer=FileSystemWriter(str(directory)))


def load(directory: Path, templates: dict) -> None:
    """Fill `templates` (same structure as saved, this world size's shapes) in place."""
    reader = _SafeReader(str(directory))
    reader.read_metadata()  # refuses a planted .metadata here, before DCP wraps the error
    dcp.load(templates, storage_reader=reader)
