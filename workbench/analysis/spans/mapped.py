"""A file of named arrays that opens as a memory map: the on-disk form of a run's span index.

The timeline index of a big run (`workbench.analysis.spans.index`) takes seconds of sorting and gathering to
build from events.parquet; kept in this file beside it, opening the run is a map of the file and a few small
reads, and a query touches only the pages it needs. Layout (little-endian):

    b"WBARRAY1"  uint64 header length  header (UTF-8 JSON)  arrays, each at a 64-byte aligned offset

The header holds `meta` (any JSON the writer gives) and, per array, its dtype, shape and offset. Numeric
arrays come back as read-only views of the map; string arrays (stored as UTF-8 bytes and end offsets) are
decoded into object arrays. A file is written under a hidden temporary name and renamed into place, so
readers see a complete file or none; `read` answers None for a file that is missing, truncated or not of
this format, and its writer then builds it again.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import mmap
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workbench.trace.store.scratch import owner_gone, remove_entry, scratch_name

MAGIC = b"WBARRAY1"
ALIGN = 64
_LENGTH = struct.Struct("<Q")
_PARQUET_TAIL = struct.Struct("<I4s")


@dataclass(frozen=True)
class Stored:
    """The arrays and metadata of a file read back."""

    arrays: dict[str, np.ndarray]
    meta: dict[str, Any]


def write(path: Path, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
    """Write `arrays` (numeric, or object arrays of str) and `meta` to `path` atomically: into a hidden
    temporary file of the same folder, then renamed over `path`. Leftovers of writers killed earlier are
    removed first; on failure nothing is left but what was there before."""
    entries: dict[str, dict[str, Any]] = {}
    blobs: list[tuple[int, memoryview | bytes]] = []
    offset = 0
    for name, array in arrays.items():
        parts = _string_parts(array) if array.dtype == object else {"": np.ascontiguousarray(array)}
        for suffix, part in parts.items():
            entries[name + suffix] = {"dtype": part.dtype.str, "shape": list(part.shape), "offset": offset}
            blobs.append((offset, part.data.cast("B") if part.size else b""))
            offset = _aligned(offset + part.nbytes)
    header = json.dumps({"meta": dict(meta), "arrays": entries, "strings": [n for n, a in arrays.items()
                                                                            if a.dtype == object]}).encode()
    start = _aligned(len(MAGIC) + _LENGTH.size + len(header))
    for stale in path.parent.glob(f".tmp-{path.name}-*"):
        if owner_gone(stale.name):
            remove_entry(stale)
    tmp = path.with_name(scratch_name("tmp", path.name))
    try:
        with open(tmp, "wb") as out:
            out.write(MAGIC + _LENGTH.pack(len(header)) + header)
            for at, blob in blobs:
                out.seek(start + at)
                out.write(blob)
            out.truncate(start + offset)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read(path: Path) -> Stored | None:
    """The arrays and metadata of the file at `path`, numeric arrays mapped; None when there is no such file
    or it is not a complete file of this format."""
    try:
        with open(path, "rb") as source:
            mapped = mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # ValueError: an empty file cannot be mapped
        return None
    try:
        if mapped[:len(MAGIC)] != MAGIC:
            return None
        (length,) = _LENGTH.unpack_from(mapped, len(MAGIC))
        header = json.loads(mapped[len(MAGIC) + _LENGTH.size:len(MAGIC) + _LENGTH.size + length])
        if not isinstance(header.get("meta"), dict):
            return None
        start = _aligned(len(MAGIC) + _LENGTH.size + length)
        arrays = {}
        for name, entry in header["arrays"].items():
            dtype, shape = np.dtype(entry["dtype"]), tuple(entry["shape"])
            count = int(np.prod(shape))
            at = start + int(entry["offset"])
            if dtype.hasobject or at + count * dtype.itemsize > len(mapped):
                return None
            arrays[name] = np.frombuffer(mapped, dtype, count, at).reshape(shape)
        for name in header["strings"]:
            arrays[name] = _strings(arrays.pop(f"{name}.data"), arrays.pop(f"{name}.ends"))
        return Stored(arrays, header["meta"])
    except (struct.error, ValueError, KeyError, TypeError, AttributeError):  # json's errors are ValueErrors
        return None


def parquet_fingerprint(path: Path) -> str:
    """What identifies the content of the Parquet file at `path` without reading it: its size and a hash of
    its footer (the schema, every column chunk's place, size and statistics). Raises OSError, or ValueError
    when the file does not end as a Parquet file does."""
    with open(path, "rb") as source:
        size = source.seek(0, os.SEEK_END)
        if size < 12:
            raise ValueError("not a Parquet file (too short)")
        source.seek(size - _PARQUET_TAIL.size)
        length, magic = _PARQUET_TAIL.unpack(source.read(_PARQUET_TAIL.size))
        if magic != b"PAR1" or length > size - 12:
            raise ValueError("not a Parquet file (no footer)")
        source.seek(size - _PARQUET_TAIL.size - length)
        footer = source.read(length)
    return f"{size}:{hashlib.sha256(footer).hexdigest()}"


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


def _string_parts(array: np.ndarray) -> dict[str, np.ndarray]:
    """An object array of str as its UTF-8 bytes and the end offset of each string in them."""
    encoded = [str(text).encode("utf-8", "surrogatepass") for text in array.tolist()]
    ends = np.cumsum([len(b) for b in encoded], dtype=np.int64)
    return {".data": np.frombuffer(b"".join(encoded), dtype=np.uint8), ".ends": ends}


def _strings(data: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The object array of str that `_string_parts` stored."""
    raw = data.tobytes()
    texts = np.empty(len(ends), dtype=object)
    texts[:] = [raw[a:b].decode("utf-8", "surrogatepass") for a, b in itertools.pairwise([0, *ends.tolist()])]
    return texts
