"""Progress of a long trace read: readers say how far they are, and a caller that shows progress listens.

`listening(listener)` makes the reads inside it call `listener(path, done, total, unit)` as they go: the
JSON readers per block read (`unit` "bytes", of the file on disk, so a gzip file counts compressed bytes),
the XSpace reader per plane, the nsys reader per table. Nothing listens by default, and a report costs a
context-variable lookup.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import IO

Listener = Callable[[str, int, int, str], None]
"""`listener(path, done, total, unit)`: `done` of `total` `unit`s of the file at `path` read."""

_LISTENER: ContextVar[Listener | None] = ContextVar("workbench_read_progress", default=None)


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Call `listener` with the progress of the trace reads inside this block."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)


def advance(path: object, done: int, total: int, unit: str) -> None:
    """Say that `done` of `total` `unit`s of the file at `path` are read."""
    listener = _LISTENER.get()
    if listener is not None:
        listener(str(path), done, total, unit)


def advance_in_file(path: object, stream: IO[bytes]) -> None:
    """Say how far `stream` has read the file at `path`, in bytes on disk (a GzipFile's compressed bytes)."""
    if _LISTENER.get() is None:
        return
    raw = getattr(stream, "fileobj", stream)  # a GzipFile reads from its `fileobj`
    try:
        done, total = raw.tell(), os.fstat(raw.fileno()).st_size
    except (OSError, AttributeError, ValueError):  # a stream that is not a file on disk
        return
    advance(path, done, total, "bytes")


def describe(path: str, done: int, total: int, unit: str) -> str:
    """One line for a progress report: "reading trace.json.gz: 45% of 270.0 MB", "... plane 3 of 9"."""
    name = os.path.basename(path)
    if unit == "bytes":
        share = f"{done / total:.0%} of " if total else ""
        return f"reading {name}: {share}{total / 1e6:,.1f} MB"
    return f"reading {name}: {unit.removesuffix('s')} {done:,} of {total:,}"
