"""Trace formats behind a registry keyed by format name, with content sniffing.

A reader registers a name, the file suffixes it claims, a sniff test on the file's first bytes,
and the function that reads it. `read_trace` picks the reader by sniffing, so a misnamed file
still reads, and an unknown one fails with the list of formats. A format whose traces can be
folders (an XSpace run) also gives `accepts_dir`; a folder goes to the first format that accepts it.
Input that is neither a regular file nor a folder (a FIFO, a device) is refused before it is opened.
"""

from __future__ import annotations

import gzip
import os
import stat
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from workbench.errors import TraceFormatError
from workbench.trace.model import Trace

SNIFF_BYTES = 4096
_WHITESPACE = b" \t\r\n"


@dataclass(frozen=True)
class TraceFormat:
    """A registered trace format."""

    name: str
    suffixes: tuple[str, ...]
    sniff: Callable[[bytes], bool]
    read: Callable[[Path], Trace]
    accepts_dir: Callable[[Path], bool] | None = None
    """For formats that read folders: whether this folder is one of their traces."""


_FORMATS: dict[str, TraceFormat] = {}


def register_format(fmt: TraceFormat) -> None:
    """Add (or replace) a format; later issues register XSpace, nsys SQLite and ncu CSV here."""
    _FORMATS[fmt.name] = fmt


def formats() -> list[str]:
    """Names of the registered formats."""
    return sorted(_FORMATS)


def _head(path: Path) -> bytes:
    """The first bytes of the file's content, decompressed if it is gzip (past any leading whitespace
    longer than that, which a sniff could not see past)."""
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError as exc:
        raise TraceFormatError(path, f"cannot open: {exc.strerror}") from exc
    gz = head[:2] == b"\x1f\x8b"
    if gz:
        try:
            head = zlib.decompressobj(wbits=31).decompress(head, SNIFF_BYTES)
        except zlib.error as exc:
            raise TraceFormatError(path, f"corrupt gzip data ({exc})") from exc
    if len(head) == SNIFF_BYTES and not head.strip(_WHITESPACE):
        return _after_whitespace(path, gz) or head
    return head


def _after_whitespace(path: Path, gz: bool) -> bytes | None:
    """The first bytes of the file's content from its first that is not whitespace on (None if none is)."""
    try:
        with gzip.open(path, "rb") if gz else open(path, "rb") as f:
            while block := f.read(1 << 20):
                if text := block.lstrip(_WHITESPACE):
                    return text[:SNIFF_BYTES]
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TraceFormatError(path, f"corrupt or truncated gzip data ({exc})") from exc
    except OSError as exc:
        raise TraceFormatError(path, f"cannot read: {exc.strerror or exc}") from exc
    return None


_NOT_REGULAR = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
                stat.S_IFBLK: "a block device"}


def _input_is_folder(path: Path) -> bool:
    """Whether the input `path` is a folder, else a regular file: anything else is refused before it is
    opened (opening a named pipe would wait for a writer)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError as exc:
        raise TraceFormatError(path, "no such file") from exc
    except OSError as exc:
        raise TraceFormatError(path, f"cannot open: {exc.strerror}") from exc
    if stat.S_ISDIR(mode):
        return True
    if not stat.S_ISREG(mode):
        kind = _NOT_REGULAR.get(stat.S_IFMT(mode), "not a file")
        raise TraceFormatError(path, f"is not a regular file ({kind}): give a trace file or a profile folder")
    return False


def sniff_format(path: str | os.PathLike[str]) -> str:
    """The name of the format whose sniff test accepts the file's first bytes (or that accepts the folder)."""
    path = Path(path)
    if _input_is_folder(path):
        for fmt in _FORMATS.values():
            if fmt.accepts_dir is not None and fmt.accepts_dir(path):
                return fmt.name
        readers = [f.name for f in _FORMATS.values() if f.accepts_dir is not None]
        raise TraceFormatError(path, f"a folder holding no trace that a folder-reading format "
                                     f"({', '.join(readers) or 'none registered'}) recognizes")
    head = _head(path)
    if not head.strip(_WHITESPACE):
        raise TraceFormatError(path, "empty file" if not head else "empty file (only whitespace)")
    by_suffix = [f for f in _FORMATS.values() if any(str(path).endswith(s) for s in f.suffixes)]
    for fmt in [*by_suffix, *_FORMATS.values()]:
        if fmt.sniff(head):
            return fmt.name
    raise TraceFormatError(path, f"unrecognized trace format (known formats: {', '.join(formats())})")


def read_trace(path: str | os.PathLike[str], format: str | None = None) -> Trace:
    """Read any supported trace file into a `Trace`; `format` skips sniffing."""
    path = Path(path)
    name = format or sniff_format(path)
    if name not in _FORMATS:
        raise TraceFormatError(path, f"unknown format {name!r} (known: {', '.join(formats())})")
    if format is not None and _input_is_folder(path) and _FORMATS[name].accepts_dir is None:
        raise TraceFormatError(path, f"is a folder, not a {name} trace file")
    try:
        return _FORMATS[name].read(path)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TraceFormatError(path, f"corrupt or truncated gzip data ({exc})") from exc


def _looks_like_json(head: bytes) -> bool:
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    return text[:1] in (b"{", b"[")


def _looks_like_ort_profile(head: bytes) -> bool:
    from workbench.trace.formats.ort_profile import looks_like_ort_profile

    return looks_like_ort_profile(head)


def _read_ort_profile(path: Path) -> Trace:
    from workbench.trace.formats.ort_profile import read_ort_profile

    return read_ort_profile(path)


# before kineto, whose sniff takes any JSON: ONNX Runtime's profile is a Chrome-trace array of its own
register_format(TraceFormat("ort_profile", (".json", ".json.gz"), _looks_like_ort_profile, _read_ort_profile))


def _read_kineto(path: Path) -> Trace:
    from workbench.trace.kineto.reader import read_kineto

    return read_kineto(path)


register_format(TraceFormat("kineto", (".json", ".json.gz"), _looks_like_json, _read_kineto))


def _looks_like_sqlite(head: bytes) -> bool:
    return head.startswith(b"SQLite format 3\x00")


def _read_nsys(path: Path) -> Trace:
    from workbench.trace.nsys.reader import read_nsys

    return read_nsys(path)


register_format(TraceFormat("nsys", (".sqlite", ".nsys.sqlite"), _looks_like_sqlite, _read_nsys))


def _looks_like_xspace(head: bytes) -> bool:
    from workbench.trace.xspace.reader import looks_like_xspace

    return looks_like_xspace(head)


def _read_xspace(path: Path) -> Trace:
    from workbench.trace.xspace.reader import read_xspace

    return read_xspace(path)


def _xspace_dir(path: Path) -> bool:
    from workbench.trace.xspace.reader import accepts_dir

    return accepts_dir(path)


register_format(TraceFormat("xspace", (".xplane.pb",), _looks_like_xspace, _read_xspace, _xspace_dir))


def _looks_like_perfetto(head: bytes) -> bool:
    from workbench.trace.perfetto.reader import looks_like_perfetto

    return looks_like_perfetto(head)


def _read_perfetto(path: Path) -> Trace:
    from workbench.trace.perfetto.reader import read_perfetto

    return read_perfetto(path)


# after xspace, whose traces also start with a field 1 message: `.xplane.pb` files reach its sniff first
register_format(TraceFormat("perfetto", (".perfetto-trace", ".pftrace", ".pb", ".perfetto-trace.gz", ".pftrace.gz"),
                            _looks_like_perfetto, _read_perfetto))
