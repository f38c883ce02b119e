"""Stream the `traceEvents` array of a Chrome-trace JSON document in decoded chunks.

A Kineto trace of a million events is ~300 MB of JSON. Decoding it whole holds the text and every
decoded object at once; instead the text is read in blocks, cut at event boundaries, and each
chunk is decoded on its own (by msgspec, in C), so peak memory is one block plus the columns built
so far.

A cut is a guess (the last `}` `,` `{` of the text read) checked by decoding: a chunk that starts at
a true event boundary parses as a JSON array only if it also ends at one, and a wrong guess (inside
a string or a nested object) fails only where the text ends. So where decoding fails says which it
was: before the end, the file has a syntax error there (raised at once, with its cause and byte
offset); at the end, the cut was wrong, and the guess before it is tried; past a closing bracket,
the events array ends there. After a few wrong guesses (or with none to make), the values are
stepped over one by one (`_walk`, a syntax check per value, in C) to find the last true boundary.
Each byte is decoded a bounded number of times, so a file that is no trace fails in time linear in
its size, however its brackets fall.

Both layouts of the format are accepted: the object form (`{"traceEvents": [...], ...}`, other
top-level keys before or after the array) and the bare array form (`[...]`, whose closing bracket
and a trailing comma are optional, as in Chrome's own traces). A document whose array holds no
event objects (a torch memory-timeline export is an array of arrays) is refused at its first item.

Decoding is most of the work and each chunk's is independent of the others', so a regular file can
be decoded by worker processes (`TraceEventStream.parallel`): this process only plans the cuts, a
cut is trusted until its chunk is decoded, and a wrong one is decoded again here and handled as
above, so the chunks, their order and the errors are the ones iterating gives.
"""

from __future__ import annotations

import gzip
import multiprocessing
import os
import re
import sys
import zlib
from collections import deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import IO, Any, TypeVar

import msgspec

from workbench.errors import TraceFormatError, WorkbenchError
from workbench.trace.kineto.jsonerrors import (
    EXPECTED,
    NOT_SPACE,
    TRAILING_CHARACTERS,
    JsonProblem,
    first_item_problem,
    header_keys,
    kind_of,
    not_a_trace,
    syntax_problem,
    trailer_keys,
    trailing_at,
    truncated_value,
)
from workbench.trace.progress import advance_in_file

T = TypeVar("T")

BLOCK_BYTES = 4 << 20
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_KEY_OVERLAP = 4096
"""Bytes before the newly read ones where the search for the traceEvents key restarts (a key split
between two reads)."""
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_SPACE = b" \t\r\n"
_HEADER_LIMIT = 256 << 20
_EVENT_LIMIT_BLOCKS = 4
_GUESSES = 3
"""Boundaries tried, from the last one back, before the values are stepped over one by one instead."""
"""An event that does not end within this many blocks is an error (an unclosed bracket or string)."""
_RAW = msgspec.json.Decoder(msgspec.Raw)
_BOM = b"\xef\xbb\xbf"
_OPEN, _CLOSE, _COMMA = ord("["), ord("]"), ord(",")


class ChunkDecodeError(Exception):
    """Raised by a chunk decoder when the text is not syntactically valid JSON, with msgspec's
    DecodeError message (which says where: see `jsonerrors.syntax_problem`)."""


@dataclass(frozen=True)
class Span:
    """A run of whole events that a planning stream proposes as a chunk without decoding it.

    Its JSON array text is the file's bytes [start, stop) with the first byte (the one before the
    first event) and the last (the one after the last event's `}`) replaced by `[` and `]`. If that
    text does not decode, the cut is decoded again here (`TraceEventStream.resume`), from the
    stream's state when it was made: `read_end` and `eof`.
    """

    start: int
    stop: int
    read_end: int
    eof: bool


@dataclass(frozen=True)
class _Walk:
    """Where `_walk` got to: the values before `stop` (the index after the last one) are whole;
    `resume` is where the next value starts (or the data ends); `close` is the index of the events
    array's `]` if it was reached."""

    stop: int | None
    resume: int
    close: int | None = None


def can_fork() -> bool:
    """Whether `TraceEventStream.parallel` may run here: it forks its workers (cheap, and they share
    the parent's imports), which is only the safe default on Linux, and a daemonic process (a
    multiprocessing.Pool worker) may not have children."""
    return (sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()
            and not multiprocessing.current_process().daemon)


class TraceEventStream:
    """Iterate decoded chunks of the events array; `header` holds the other top-level keys.

    `decode(text)` receives a JSON array text of whole events and returns anything; it must raise
    `ChunkDecodeError` for malformed JSON (and only then), so that a wrong cut can be told from a
    syntax error. Errors in the file are `TraceFormatError`s, one line each, with the byte offset
    (of the decompressed text, for gzip) where there is one.
    """

    def __init__(self, stream: IO[bytes], path: object, decode: Callable[[bytes], T],
                 block_bytes: int | None = None) -> None:
        self._stream = stream
        self._path = path
        self._decode = decode
        self._block = block_bytes or BLOCK_BYTES
        self._gzip = isinstance(stream, gzip.GzipFile)
        self._start = 0  # file offset of the buffer's first byte
        self._position = 0  # file offset up to which the stream has been read
        self._eof = False
        self._closed = False  # the events array has been read to its end
        self._plan = False  # propose Spans instead of decoding chunks (see `parallel`)
        self._verify = False  # decode the next cut here even while planning (a restarted one)
        self.header: dict[str, Any] = {}
        self._opening_header: dict[str, Any] = {}
        self.array_form = False
        self._scratch: bytearray | None = None

    # -- reading and errors ----------------------------------------------------------------------

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
            raise self._error(f"truncated gzip file: the compressed data ends early ({exc})") from exc
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise self._error(f"corrupt gzip data ({exc})") from exc
        except OSError as exc:
            raise self._error(f"cannot read: {exc}") from exc
        with memoryview(self._scratch) as view, view[:n] as data:
            buf += data
        self._position += n
        if not n:
            self._eof = True
        advance_in_file(self._path, self._stream)

    def _error(self, problem: str) -> TraceFormatError:
        return TraceFormatError(self._path, problem)

    def _byte(self, offset: int) -> str:
        """A file offset as the messages give it."""
        return f"byte {offset:,}" + (" of the decompressed data" if self._gzip else "")

    def _refuse(self, problem: JsonProblem, base: int) -> TraceFormatError:
        """The error for `problem`, found in a text whose first byte is at file offset `base`."""
        cause = "data after the end of the JSON document" if problem.cause == TRAILING_CHARACTERS else problem.cause
        where = "" if problem.offset is None else f" at {self._byte(base + problem.offset)}"
        return self._error(f"not valid JSON{where}: {cause}" if problem.syntax else cause + where)

    # -- the document around the events array -----------------------------------------------------

    def _open_array(self) -> bytearray:
        """Read up to the start of the events array; return the buffer from its `[` on."""
        buf = bytearray()
        self._append(buf)
        if buf.startswith(_BOM):
            del buf[: len(_BOM)]
            self._start = len(_BOM)
        while (first := NOT_SPACE.search(buf)) is None and not self._eof:
            self._start += len(buf)
            buf.clear()
            self._append(buf)
        if first is None:
            raise self._error("empty file" if not self._position else "empty file (only whitespace)")
        del buf[: first.start()]
        self._start += first.start()
        if buf[0] == _OPEN:
            self.array_form = True
        elif buf[0] == ord("{"):
            searched = 0
            while (match := _EVENTS_KEY.search(buf, max(0, searched - _KEY_OVERLAP))) is None:
                if not self._eof and len(buf) > _HEADER_LIMIT:
                    raise self._error(f"a JSON object with no 'traceEvents' array in its first {_HEADER_LIMIT >> 20} "
                                      f"MB, not a Chrome trace ({EXPECTED})")
                if self._eof:
                    raise self._refuse(not_a_trace(buf), self._start)
                searched = len(buf)
                self._append(buf)
            try:
                self.header.update(header_keys(bytes(buf[: match.start()])))
            except JsonProblem as problem:
                raise self._refuse(problem, self._start) from problem
            del buf[: match.end() - 1]
            self._start += match.end() - 1
        else:
            kind = kind_of(buf[0])
            raise self._error(f"a JSON {kind}, not a Chrome trace ({EXPECTED})" if kind
                              else f"not JSON: starts with {bytes(buf[:16])!r}")
        item = NOT_SPACE.search(buf, 1)
        problem = first_item_problem(buf[item.start()], self.array_form) if item else None
        if problem:
            raise self._refuse(problem, self._start)
        return buf

    def _finish_document(self, buf: bytearray, after: int) -> None:
        """Read the rest of the file, the text after the events array's `]` (at `after` - 1), and
        take the top-level keys there."""
        while not self._eof:
            self._append(buf)
        try:
            self.header.update(trailer_keys(buf[after:], self.array_form))
        except JsonProblem as problem:
            raise self._refuse(problem, self._start + after) from problem

    # -- the events array --------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        buf = self._open_array()
        self._opening_header = dict(self.header)
        yield from self._chunks(buf, 1)  # head: the next undecoded event in buf, after the array's `[`

    def _chunks(self, buf: bytearray, head: int, fresh: bool = True) -> Iterator[Any]:
        """Read, cut and decode from `head` on, then the rest of the document. `fresh` is False when the
        cutting is restarted: the block the next cut is made after is then already in `buf`."""
        if fresh:
            self._append(buf)
        while not self._closed:
            if self._eof or len(buf) - head >= self._block:
                head = yield from self._cut(buf, head)
                if head > self._block and not self._closed:
                    del buf[: head - 1]  # keep one byte before the next event (see _cut)
                    self._start += head - 1
                    head = 1
            if not self._eof:
                self._append(buf)
        if head < len(buf) and buf[head] == _CLOSE:
            self._finish_document(buf, head + 1)
        elif not self.array_form:  # the closing bracket is optional in the array form only
            raise self._refuse(JsonProblem("truncated (the file ends before the traceEvents array closes)", 0),
                               self._position)

    def _cut(self, buf: bytearray, head: int) -> Generator[Any, None, int]:
        """Yield the longest run of whole events from `head` that the data read allows; return the new
        head (the `]` of the events array once `_closed`). While planning, a run that ends at a guessed
        boundary is yielded as a `Span`, undecoded.

        A run is decoded in place: the byte before it and the one after its last event (whitespace or
        the separating comma) are overwritten with `[` and `]` for the decoder and restored.
        """
        end = len(buf)
        for _ in range(_GUESSES):
            pos = _last_boundary(buf, head, end)
            if pos is None:
                if end == len(buf) and not self._eof and len(buf) - head <= _EVENT_LIMIT_BLOCKS * self._block:
                    return head  # the next boundary is in a block not read yet
                break
            after = _BOUNDARY.match(buf, pos).end() - 1  # type: ignore[union-attr] - pos is one
            if self._plan and not self._verify:
                yield Span(self._start + head - 1, self._start + pos + 2, self._position, self._eof)
                return after
            chunk, problem = self._decode_in_place(buf, head, pos + 1)
            if problem is None:
                yield chunk
                return after
            if problem.cause == TRAILING_CHARACTERS and problem.offset is not None:  # the array closes before
                close = _before_space(buf, head - 1 + problem.offset) - 1
                chunk, problem = self._decode_in_place(buf, head, close)
                if problem is None:
                    yield chunk
                    self._closed = True
                    return close
                break
            if not problem.ended and (problem.offset is None or problem.offset < pos + 2 - head):
                raise self._refuse(problem, self._start + head - 1)  # before the `]` put after the cut
            end = pos  # a wrong cut, inside an event: try the one before
        return (yield from self._cut_walked(buf, head))

    def _cut_walked(self, buf: bytearray, head: int) -> Generator[Any, None, int]:
        """`_cut` where guessing failed: cut after the last value that `_walk` finds whole."""
        walk = self._walk(buf, head)
        if walk.stop is not None or walk.close is not None or self._eof:
            chunk, problem = self._decode_in_place(buf, head, walk.stop)
            if problem is not None:  # the walk checked the syntax: only what it does not check is left
                raise self._refuse(problem, self._start + head - 1)
            yield chunk
        if walk.close is not None or self._eof:
            self._closed = True
            return walk.close if walk.close is not None else len(buf)
        if walk.stop is None and len(buf) - head > _EVENT_LIMIT_BLOCKS * self._block:
            limit = _EVENT_LIMIT_BLOCKS * self._block
            raise self._refuse(JsonProblem(f"an event that does not end within {limit:,} bytes (a bracket or string "
                                           "in it never closes)", 0), self._start + walk.resume)
        return walk.resume

    def _walk(self, buf: bytearray, head: int) -> _Walk:
        """Step over the array's values from `head` one at a time, each checked by msgspec (in C), to the
        end of the data read or of the array. At the end of the file, a last value with no comma after
        it is whole too (the array form may end so). A syntax error is raised with its cause and offset.
        """
        stop = None
        n = len(buf)
        with memoryview(buf) as view:
            at = head
            while True:
                found = NOT_SPACE.search(buf, at)
                if found is None:
                    return _Walk(stop, n)
                at = found.start()
                if buf[at] == _CLOSE:
                    return _Walk(stop, at, at)
                with view[at:] as rest:
                    try:
                        _RAW.decode(rest)
                    except msgspec.DecodeError as exc:
                        message = str(exc)
                    else:  # the value runs to the end of the data read
                        return _Walk(_before_space(buf, n), n) if self._eof else _Walk(stop, at)
                    separator = trailing_at(message)
                    if separator is None:
                        problem = syntax_problem(message, rest)
                if separator is not None:  # the value ends before it
                    separator += at
                    if buf[separator] == _COMMA:
                        stop, at = _before_space(buf, separator), separator + 1
                        continue
                    if buf[separator] == _CLOSE:
                        return _Walk(_before_space(buf, separator), separator, separator)
                    raise self._refuse(JsonProblem("expected ',' or ']'", separator), self._start)
                if not problem.ended:
                    raise self._refuse(problem, self._start + at)
                if self._eof:
                    with view[at:] as rest:
                        raise self._refuse(truncated_value(rest, "event"), self._start + at)
                return _Walk(stop, at)

    def _decode_in_place(self, buf: bytearray, head: int, stop: int | None) -> tuple[Any, JsonProblem | None]:
        """Decode buf[head:stop] (None: nothing) as a JSON array, with buf[head - 1] and buf[stop] as its
        brackets; (the chunk, None) or (None, the syntax problem)."""
        if stop is None:
            return self._decode(b"[]"), None
        if stop == len(buf):  # the file's last value, nothing after it
            buf.append(_CLOSE)
            try:
                return self._decode_in_place(buf, head, stop)
            finally:
                del buf[-1]
        before, after = buf[head - 1], buf[stop]
        buf[head - 1], buf[stop] = _OPEN, _CLOSE
        try:
            with memoryview(buf) as view, view[head - 1: stop + 1] as text:
                try:
                    chunk = self._decode(text)
                except ChunkDecodeError as exc:
                    return None, syntax_problem(str(exc), text)
            self._verify = False
            return chunk, None
        finally:
            buf[head - 1], buf[stop] = before, after

    # -- decoding in worker processes ------------------------------------------------------------

    def resume(self, span: Span) -> Iterator[Any]:
        """Restart the cutting where `span` was cut, with it found not to decode: it is decoded again
        here (as iterating would have), then planning goes on."""
        try:
            self._stream.seek(span.start)
            text = self._stream.read(span.read_end - span.start)
        except OSError as exc:
            raise self._error(f"cannot read: {exc}") from exc
        if len(text) != span.read_end - span.start:
            raise self._error(f"the file changed while it was being read (at {self._byte(span.start)})")
        self.header.clear()
        self.header.update(self._opening_header)  # drop keys read after a wrong cut
        self._start = span.start
        self._position, self._eof = span.read_end, span.eof
        self._closed = False
        self._verify = True
        return self._chunks(bytearray(text), 1, fresh=False)

    def parallel(self, workers: int, window: int | None = None) -> Iterator[Any]:
        """The chunks that iterating gives, in order, decoded by `workers` forked processes.

        For a regular file named by `path` (the workers read their spans from it) and a `decode` that
        is a module-level function and accepts an empty array. This process plans the cuts without
        decoding them (`Span`s) and takes the results in file order, at most `window` chunks ahead
        (default 4 x workers: the first chunk is twice the size of the others and each worker's first
        is its slowest, so a shorter window leaves the other workers idle behind it). A span that does
        not decode is decoded again here, the spans after it dropped, and the cutting goes on from
        there (`resume`). What the planning raises (malformed or truncated JSON, an error of a chunk
        decoded here) is raised once the spans before it have decoded, so iterating and this raise the
        same errors. Other errors of a worker are raised as
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
                    raise self._error(f"cannot read at {self._byte(item.start)}: {exc}") from exc
                except BrokenProcessPool as exc:
                    raise WorkbenchError(f"{self._path}: a process decoding the trace died ({exc})") from exc
                yield chunk
        finally:
            self._plan = False
            pool.shutdown(wait=True, cancel_futures=True)


def _last_boundary(buf: bytearray, head: int, end: int) -> int | None:
    """Index of the `}` of the last `}` `,` `{` in buf[head:end] (a guessed event boundary), if any."""
    while (pos := buf.rfind(b"}", head, end)) >= 0:
        if _BOUNDARY.match(buf, pos):
            return pos
        end = pos
    return None


def _before_space(buf: bytearray, index: int) -> int:
    """`index`, moved back over the whitespace before it."""
    while index > 0 and buf[index - 1] in _SPACE:
        index -= 1
    return index


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
