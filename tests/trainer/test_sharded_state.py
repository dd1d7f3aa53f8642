"""The sharded resume state's `.metadata` (a pickle) loads however the saving Python pickled
DCP's enums, and its allow-list still refuses anything that could run code."""

from __future__ import annotations

import enum
import io
import pickle
from pathlib import Path

import pytest
import torch

from trainer import sharded_state
from trainer.sharded_state import UnsafeMetadataError


class _EnumsByName(pickle.Pickler):
    """Pickles enum members as `getattr(cls, name)`, as Debian bookworm's Python 3.11.2 does
    (later 3.11 releases pickle them by value)."""

    def reducer_override(self, obj):
        if isinstance(obj, enum.Enum):
            return getattr, (type(obj), obj.name)
        return NotImplemented


def _repickle_by_name(metadata_path: Path) -> bytes:
    with open(metadata_path, "rb") as handle:
        metadata = pickle.load(handle)  # the test's own file: plain pickle is fine here
    buffer = io.BytesIO()
    _EnumsByName(buffer).dump(metadata)
    return buffer.getvalue()


def test_metadata_with_enums_pickled_by_name_loads(tmp_path):
    saved = {"model": {"w": torch.arange(6, dtype=torch.float64).reshape(2, 3)},
             "step": torch.tensor(7)}
    sharded_state.save(tmp_path, saved)
    metadata = tmp_path / ".metadata"
    by_name = _repickle_by_name(metadata)
    assert b"getattr" in by_name  # DCP's metadata holds enums (its memory-format encoding)
    metadata.write_bytes(by_name)

    templates = {"model": {"w": torch.zeros(2, 3, dtype=torch.float64)},
                 "step": torch.tensor(0)}
    sharded_state.load(tmp_path, templates)
    assert torch.equal(templates["model"]["w"], saved["model"]["w"])
    assert templates["step"].item() == 7


class _WritesMarker:
    """Unpickling this object writes `marker` (what a hostile resume file would do instead)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return Path.write_text, (self.marker, "code ran")


class _MethodsByGetattr(pickle.Pickler):
    """Pickles `Path.write_text` as `getattr(Path, "write_text")`: the by-name form, aimed
    past enum members at a method that writes a file."""

    def reducer_override(self, obj):
        if obj is Path.write_text:
            return getattr, (Path, "write_text")
        return NotImplemented


def test_getattr_other_than_an_enum_member_is_refused(tmp_path):
    sharded_state.save(tmp_path, {"w": torch.ones(2)})
    marker = tmp_path / "marker"
    buffer = io.BytesIO()
    _MethodsByGetattr(buffer).dump(_WritesMarker(marker))
    assert b"getattr" in buffer.getvalue() and b"write_text" in buffer.getvalue()
    (tmp_path / ".metadata").write_bytes(buffer.getvalue())
    with pytest.raises(UnsafeMetadataError, match="getattr"):
        sharded_state.load(tmp_path, {"w": torch.zeros(2)})
    assert not marker.exists()
