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

Decoding is most of the work and each chunk's is independent of the others', so a regular file can
be decoded by worker processes (`TraceEventStream.parallel`): this process only plans the cuts, a
cut is trusted until its chunk is decoded, and a wrong one is retried as above, so the chunks, their
order and the errors are the ones iterating gives.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import sys
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import IO, Any, TypeVar

import msgspec

from workbench.errors import TraceFormatError, WorkbenchError

T = TypeVar("T")

BLOCK_BYTES = 4 << 20
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_HEADER_LIMIT = 256 << 20


class ChunkDecodeError(Exception):
    """Raised by a chunk decoder when the text is not syntactically valid JSON (a wrong cut)."""


@dataclass(frozen=True)
class Span:
    """A run of whole events that a planning stream proposes as a chunk without decoding it.

    Its JSON array text is the file's bytes [start, stop) with the first byte (the one before the
    first event) and the last (the one after the last event's `}`) replaced by `[` and `]`. If that
    text does not decode, the cut was wrong: `read_end` and `eof` are the stream's state when the cut
    was made, from which the cutting is restarted (`TraceEventStream.resume`).
    """

    start: int
    stop: int
    read_end: int
    eof: bool


def can_fork() -> bool:
    """Whether `TraceEventStream.parallel` may run here: it forks its workers (cheap, and they share
    the parent's imports), which is only the safe default on Linux, and a daemonic process (a
    multiprocessing.Pool worker) may not have children."""
    return (sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()
            and not multiprocessing.current_process().daemon)


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
        self._consumed = 0  # offset, after any byte-order mark, of the next undecoded event
        self._base = 0  # length of the byte-order mark: file offset = stream offset + _base
        self._position = 0  # file offset up to which the stream has been read
        self._eof = False
        self._plan = False  # propose Spans instead of decoding chunks (see `parallel`)
        self._verify = False  # decode the next cut here even while planning (a restarted one)
        self.header: dict[str, Any] = {}
        self._opening_header: dict[str, Any] = {}
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
        self._position += n
        if not n:
            self._eof = True

    def _error(self, problem: str, offset: int | None = None) -> TraceFormatError:
        where = f" (near byte {offset:,})" if offset is not None else ""
        return TraceFormatError(self._path, problem + where)

    def _open_array(self) -> bytes:
        """Read up to the start of the events array; return the bytes from its `[` on."""
        raw = self._read()
        buf = raw.lstrip(b"\xef\xbb\xbf")
        self._base = len(raw) - len(buf)
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
        self._opening_header = dict(self.header)
        yield from self._chunks(buf, 1)  # head: the next undecoded event in buf, after the array's `[`

    def _chunks(self, buf: bytearray, head: int, end: int | None = None) -> Iterator[Any]:
        """Read, cut and decode from `head` on. `end`, given when the cutting is restarted, means that
        the block the next cut is made after is already in `buf`, and that the next cut must end
        before the `}` at `end` (the one found wrong)."""
        if end is None:
            self._append(buf)
        while True:
            if self._eof:
                head = yield from self._cut(buf, head, end)
                yield from self._finish(bytes(buf[head:]))
                return
            if len(buf) - head >= self._block:
                head = yield from self._cut(buf, head, end)
                if head > self._block:
                    del buf[: head - 1]  # keep one byte before the next event (see _cut)
                    head = 1
            end = None
            self._append(buf)

    def _cut(self, buf: bytearray, head: int, end: int | None = None) -> Iterator[Any]:
        """Yield the longest decodable run of whole events from `head` (ending before `end`); return the
        new head. While planning, the longest run is yielded as a `Span`, undecoded.

        The run is decoded in place: the byte before it and the one after its last `}` (whitespace
        or the separating comma) are overwritten with `[` and `]` for the decoder and restored.
        """
        end = len(buf) if end is None else end
        while True:
            pos = buf.rfind(b"}", head, end)
            if pos < 0:
                if len(buf) - head > 4 * self._block:
                    raise self._error("malformed JSON in traceEvents", self._consumed)
                return head
            match = _BOUNDARY.match(buf, pos)
            if match:
                if self._plan and not self._verify:
                    to_file = self._base + self._consumed - head  # buf index -> file offset
                    ok, chunk = True, Span(to_file + head - 1, to_file + pos + 2, self._position, self._eof)
                else:
                    ok, chunk = self._try_in_place(buf, head, pos + 1)
                    self._verify = self._verify and not ok
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

    # -- decoding in worker processes ------------------------------------------------------------

    def resume(self, span: Span) -> Iterator[Any]:
        """Restart the cutting where `span` was cut, with it found wrong: the cut is retried at the
        candidates before it and decoded here (as iterating would have), then planning goes on."""
        try:
            self._stream.seek(span.start)
            text = self._stream.read(span.read_end - span.start)
        except OSError as exc:
            raise self._error(f"cannot read: {exc}") from exc
        if len(text) != span.read_end - span.start:
            raise self._error("the file changed while it was being read", span.start)
        self.header.clear()
        self.header.update(self._opening_header)  # drop keys read after a wrong cut
        self._consumed = span.start + 1 - self._base
        self._position, self._eof = span.read_end, span.eof
        self._verify = True
        return self._chunks(bytearray(text), 1, end=span.stop - 2 - span.start)

    def parallel(self, workers: int, window: int | None = None) -> Iterator[Any]:
        """The chunks that iterating gives, in order, decoded by `workers` forked processes.

        For a regular file named by `path` (the workers read their spans from it) and a `decode` that
        is a module-level function and accepts an empty array. This process plans the cuts without
        decoding them (`Span`s) and takes the results in file order, at most `window` chunks ahead
        (default 4 x workers: the first chunk is twice the size of the others and each worker's first
        is its slowest, so a shorter window leaves the other workers idle behind it). A span that does
        not decode was a wrong cut: the spans after it are dropped and the cutting restarts before it
        (`resume`). What the planning raises (malformed or
        truncated JSON, an error of a chunk decoded here) is raised once the spans before it have
        decoded, so iterating and this raise the same errors. Other errors of a worker are raised as
        they are (an OSError as a TraceFormatError); the pool is shut down however this ends.
        """
        file = os.fspath(self._path)  # type: ignore[call-overload]
        window = window or 4 * workers
        # What the decoder sets up on first use (pyarrow imports pandas for its first array) is then
        # set up once, here, and shared with the forked workers instead of repeated in each.
        self._decode(b"[]")
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
        self._plan = True
        planned = iter(self)
        queue: deque[tuple[Any, Future[Any] | None]] = deque()  # (Span, its decoding) or (a chunk, None)
        ended: BaseException | None = None  # how the planning ended: StopIteration or the error to raise
        try:
            while True:
                if ended is None and len(queue) < window:
                    try:
                        item = next(planned)
                    except Exception as exc:  # raised in its turn, below
                        ended = exc
                        continue
                    future = pool.submit(_decode_span, self._decode, file, item.start, item.stop) \
                        if isinstance(item, Span) else None
                    queue.append((item, future))
                    continue
                if not queue:
                    if isinstance(ended, StopIteration):
                        return
                    raise ended  # type: ignore[misc]
                item, future = queue.popleft()
                if future is None:
                    yield item
                    continue
                try:
                    chunk = future.result()
                except ChunkDecodeError:
                    for _, later in queue:
                        if later is not None:
                            later.cancel()
                    queue.clear()
                    planned.close()
                    planned, ended = self.resume(item), None
                    continue
                except OSError as exc:
                    raise self._error(f"cannot read: {exc}", item.start) from exc
                except BrokenProcessPool as exc:
                    raise WorkbenchError(f"{self._path}: a process decoding the trace died ({exc})") from exc
                yield chunk
        finally:
            self._plan = False
            pool.shutdown(wait=True, cancel_futures=True)


def _decode_span(decode: Callable[[bytearray], T], file: str, start: int, stop: int) -> T:
    """In a worker process: read a `Span`'s bytes from the file and decode them as a JSON array."""
    text = bytearray(stop - start)
    with open(file, "rb", buffering=0) as f:
        f.seek(start)
        n = f.readinto(text)
    if n != len(text):
        raise OSError(f"the file changed while it was being read (short read at byte {start:,})")
    text[0], text[-1] = ord("["), ord("]")
    return decode(text)
