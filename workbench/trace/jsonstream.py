"""Stream the `traceEvents` array of a Chrome-trace JSON document in decoded chunks.

A Kineto trace of a million events is ~300 MB of JSON. Decoding it whole holds the text and every
decoded object at once; instead the text is read in blocks, cut at event boundaries, and each
chunk is decoded on its own (by msgspec, in C), so peak memory is one block plus the columns built
so far.

A cut is a guess (`}` `,` `{` between two events) checked by decoding: a chunk that starts at a
true event boundary parses as a JSON array only if it also ends at one, so a wrong guess (inside a
string or a nested object) fails to decode and an earlier candidate is tried.

Both layouts of the format are accepted: the object form (`{"traceEvents": [...], ...}`, other
top-level keys before or after the array) and the bare array form (`[...]`, whose closing bracket
and a trailing comma are optional, as in Chrome's own traces).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import IO, Any, TypeVar

import msgspec

from workbench.errors import TraceFormatError

T = TypeVar("T")

BLOCK_BYTES = 4 << 20
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_HEADER_LIMIT = 256 << 20


class ChunkDecodeError(Exception):
    """Raised by a chunk decoder when the text is not syntactically valid JSON (a wrong cut)."""


class TraceEventStream:
    """Iterate decoded chunks of the events array; `header` holds the other top-level keys.

    `decode(text)` receives a JSON array text of whole events and returns anything; it must raise
    `ChunkDecodeError` for malformed JSON (and only then), so that a wrong cut can be retried.
    """

    def __init__(self, stream: IO[bytes], path: object, decode: Callable[[bytes], T],
                 block_bytes: int | None = None) -> None:
        self._stream = stream
        self._path = path
        self._decode = decode
        self._block = block_bytes or BLOCK_BYTES
        self._consumed = 0
        self._eof = False
        self.header: dict[str, Any] = {}
        self.array_form = False
        self._scratch: bytearray | None = None

    def _read(self) -> bytes:
        buf = bytearray()
        self._append(buf)
        return bytes(buf)

    def _append(self, buf: bytearray) -> None:
        """Read the next block onto the end of `buf`, through one reused scratch buffer (a fresh
        block-sized allocation per read would cost page faults on every block)."""
        if self._eof:
            return
        if self._scratch is None:
            self._scratch = bytearray(self._block)
        try:
            n = self._stream.readinto(self._scratch)
        except EOFError as exc:  # gzip stream cut short
            raise TraceFormatError(self._path, f"truncated compressed file ({exc})") from exc
        except OSError as exc:
            raise TraceFormatError(self._path, f"cannot read: {exc}") from exc
        with memoryview(self._scratch) as view, view[:n] as data:
            buf += data
        if not n:
            self._eof = True

    def _error(self, problem: str, offset: int | None = None) -> TraceFormatError:
        where = f" (near byte {offset:,})" if offset is not None else ""
        return TraceFormatError(self._path, problem + where)

    def _open_array(self) -> bytes:
        """Read up to the start of the events array; return the bytes from its `[` on."""
        buf = self._read().lstrip(b"\xef\xbb\xbf")
        while not buf.strip() and not self._eof:
            buf += self._read()
        head = buf.lstrip()
        if not head:
            raise self._error("empty file")
        if head[:1] == b"[":
            self.array_form = True
            start = len(buf) - len(head) + 1
            self._consumed = start
            return buf[start - 1:]
        if head[:1] != b"{":
            raise self._error(f"not JSON: starts with {head[:16]!r}")
        while True:
            match = _EVENTS_KEY.search(buf)
            if match:
                break
            if self._eof or len(buf) > _HEADER_LIMIT:
                self._raise_for_document(buf)
            buf += self._read()
        prefix = buf[: match.start()].rstrip()
        self.header.update(self._decode_object(prefix.rstrip(b",") + b"}"))
        self._consumed = match.end()
        return buf[match.end() - 1:]

    def _raise_for_document(self, buf: bytes) -> None:
        """The document has no traceEvents array: say whether it is even JSON."""
        if self._eof:
            try:
                msgspec.json.decode(buf)
            except msgspec.DecodeError as exc:
                raise self._error(f"not valid JSON ({exc})") from exc
        raise self._error("valid JSON but no 'traceEvents' array: not a Chrome/Kineto trace")

    def _decode_object(self, text: bytes) -> dict[str, Any]:
        try:
            value = msgspec.json.decode(text)
        except msgspec.DecodeError as exc:
            raise self._error(f"malformed top-level JSON ({exc})") from exc
        if not isinstance(value, dict):
            raise self._error("top-level JSON is not an object")
        return value

    def _try(self, body: bytes) -> tuple[bool, Any]:
        try:
            return True, self._decode(b"[" + body + b"]")
        except ChunkDecodeError:
            return False, None

    def __iter__(self) -> Iterator[Any]:
        buf = bytearray(self._open_array())
        head = 1  # start of the next undecoded event in buf, after the array's `[`
        while True:
            self._append(buf)
            if self._eof:
                head = yield from self._cut(buf, head)
                yield from self._finish(bytes(buf[head:]))
                return
            if len(buf) - head >= self._block:
                head = yield from self._cut(buf, head)
                if head > self._block:
                    del buf[: head - 1]  # keep one byte before the next event (see _cut)
                    head = 1

    def _cut(self, buf: bytearray, head: int) -> Iterator[Any]:
        """Yield the longest decodable run of whole events from `head`; return the new head.

        The run is decoded in place: the byte before it and the one after its last `}` (whitespace
        or the separating comma) are overwritten with `[` and `]` for the decoder and restored.
        """
        end = len(buf)
        while True:
            pos = buf.rfind(b"}", head, end)
            if pos < 0:
                if len(buf) - head > 4 * self._block:
                    raise self._error("malformed JSON in traceEvents", self._consumed)
                return head
            match = _BOUNDARY.match(buf, pos)
            if match:
                ok, chunk = self._try_in_place(buf, head, pos + 1)
                if ok:
                    yield chunk
                    self._consumed += match.end() - 1 - head
                    return match.end() - 1
            end = pos

    def _try_in_place(self, buf: bytearray, start: int, stop: int) -> tuple[bool, Any]:
        before, after = buf[start - 1], buf[stop]
        buf[start - 1], buf[stop] = ord("["), ord("]")
        try:
            with memoryview(buf) as view:
                return True, self._decode(view[start - 1: stop + 1])
        except ChunkDecodeError:
            return False, None
        finally:
            buf[start - 1], buf[stop] = before, after

    def _finish(self, pending: bytes) -> Iterator[Any]:
        """Decode the last events and the top-level keys after the array."""
        for match in re.finditer(rb"\]", pending):
            ok, chunk = self._try(pending[: match.start()].rstrip().rstrip(b","))
            if not ok:
                continue
            yield chunk
            trailer = pending[match.end():].strip()
            if self.array_form:
                if trailer.strip(b","):
                    raise self._error("unexpected data after the events array")
            elif trailer != b"}":
                if trailer[:1] != b",":
                    raise self._error("truncated JSON: the document does not close after traceEvents")
                self.header.update(self._decode_object(b"{" + trailer[1:]))
            return
        if self.array_form:  # the closing bracket is optional in the array form
            ok, chunk = self._try(pending.rstrip().rstrip(b","))
            if ok:
                yield chunk
                return
        raise self._error("truncated or malformed JSON: the traceEvents array does not end",
                          self._consumed)
