"""Protobuf wire decoding for Perfetto traces, in plain Python (the workbench does not depend on protobuf).

`packets` streams a trace file's `TracePacket`s one at a time: a `Trace` is one repeated length-delimited field,
so each packet is a tag, a length and that many bytes, read from a bounded buffer and never the whole file.
`fields` splits one message into (field number, wire type, value). Anything malformed (a varint past ten bytes,
a length past the message or the file, a wire type protobuf does not have) raises `WireError` with what and where.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import IO

from workbench.trace.perfetto.fields import I32, I64, LEN, TRACE_PACKET, VARINT

MAX_PACKET_BYTES = 256 << 20
"""Largest packet read: Perfetto's writers chunk packets far below this (its own limit is a few MiB), so a larger
declared length is corruption, refused before any memory is taken for it."""

BLOCK_BYTES = 1 << 20


class WireError(ValueError):
    """Bytes that are not a well-formed protobuf message: the message says what and at which offset."""


def varint(data: bytes | memoryview, at: int) -> tuple[int, int]:
    """The varint at offset `at` of `data` and the offset after it."""
    value = shift = 0
    end = min(len(data), at + 10)
    while at < end:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
    raise WireError("a varint runs past the end of its message" if at >= len(data) else "a varint longer than 10 bytes")


def signed(value: int) -> int:
    """A varint read as int64 (two's complement), as protobuf's int32/int64 fields are."""
    return value - (1 << 64) if value >= 1 << 63 else value


def fields(data: bytes | memoryview) -> Iterator[tuple[int, int, int | bytes]]:
    """The fields of one message: (number, wire type, value), the value an int for varints and fixed-width
    numbers (doubles as their bits: `as_double`) and bytes for length-delimited fields."""
    at, n = 0, len(data)
    while at < n:
        key, at = varint(data, at)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError(f"field number 0 at offset {at}")
        if wire == VARINT:
            value, at = varint(data, at)
            yield number, wire, value
        elif wire == LEN:
            size, at = varint(data, at)
            if at + size > n:
                raise WireError(f"field {number} declares {size:,} bytes at offset {at}, past its message's end "
                                f"({n:,})")
            yield number, wire, bytes(data[at:at + size])
            at += size
        elif wire in (I64, I32):
            width = 8 if wire == I64 else 4
            if at + width > n:
                raise WireError(f"field {number} is cut off at offset {at}")
            yield number, wire, int.from_bytes(data[at:at + width], "little")
            at += width
        else:
            raise WireError(f"wire type {wire} (field {number}) at offset {at}: not a protobuf message")


def as_double(bits: int) -> float:
    """A fixed64 field's bits as the double they encode."""
    return struct.unpack("<d", bits.to_bytes(8, "little"))[0]


def packed(value: int | bytes, wire: int) -> list[int]:
    """A repeated varint field's values: one (unpacked) or a packed run of them."""
    if wire != LEN:
        return [int(value)]  # type: ignore[arg-type]
    assert isinstance(value, bytes)
    out, at = [], 0
    while at < len(value):
        item, at = varint(value, at)
        out.append(item)
    return out


def packed_fixed64(value: int | bytes, wire: int) -> list[int]:
    """A repeated fixed64 field's values: one (unpacked) or a packed run of them."""
    if wire != LEN:
        return [int(value)]  # type: ignore[arg-type]
    assert isinstance(value, bytes)
    if len(value) % 8:
        raise WireError("a packed fixed64 field whose length is not a multiple of 8")
    return [int.from_bytes(value[i:i + 8], "little") for i in range(0, len(value), 8)]


def packets(stream: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """Each `TracePacket` of a `Trace` read from `stream`: (offset in the stream, its bytes). Other top-level fields
    (none are defined) are skipped; a packet larger than `MAX_PACKET_BYTES` or cut off by the end is a WireError."""
    buffer, start, offset = b"", 0, 0  # offset: stream position of buffer[0]
    while True:
        if len(buffer) - start < 20:
            more = stream.read(BLOCK_BYTES)
            buffer, offset, start = buffer[start:] + more, offset + start, 0
            if not buffer:
                return
        try:
            key, at = varint(buffer, start)
            number, wire = key >> 3, key & 7
            if wire == LEN:
                size, at = varint(buffer, at)
            elif wire in (VARINT, I64, I32):
                size = 0
            else:
                raise WireError(f"wire type {wire} at offset {offset + start}: not a Perfetto trace")
        except WireError as exc:
            if "past the end" in str(exc):
                raise WireError(f"the trace is cut off at offset {offset + len(buffer):,}") from None
            raise WireError(f"{exc} (at offset {offset + start:,})") from None
        if number == 0:
            raise WireError(f"field number 0 at offset {offset + start:,}: not a Perfetto trace")
        if wire != LEN:  # an unknown scalar field of Trace: skipped
            start = at if wire == VARINT else at + (8 if wire == I64 else 4)
            continue
        if size > MAX_PACKET_BYTES:
            raise WireError(f"a packet at offset {offset + start:,} declares {size:,} bytes, more than the "
                            f"{MAX_PACKET_BYTES >> 20} MiB any Perfetto writer makes: corrupt")
        end = at + size
        while len(buffer) < end:
            more = stream.read(max(BLOCK_BYTES, end - len(buffer)))
            if not more:
                raise WireError(f"the trace is cut off at offset {offset + len(buffer):,}: a packet at offset "
                                f"{offset + start:,} declares {size:,} bytes")
            buffer += more
        if number == TRACE_PACKET:
            yield offset + start, buffer[at:end]
        start = end


def whole_fields(data: bytes) -> list[tuple[int, int]]:
    """(number, wire type) of the fields of a message's first bytes, up to the first one they cut off or that is
    malformed (what a format sniff sees of a packet longer than its window)."""
    out, at = [], 0
    try:
        while at < len(data):
            key, at = varint(data, at)
            number, wire = key >> 3, key & 7
            if wire == VARINT:
                _, at = varint(data, at)
            elif wire == LEN:
                size, at = varint(data, at)
                at += size
            elif wire in (I64, I32):
                at += 8 if wire == I64 else 4
            else:
                break
            if at > len(data) or number == 0:
                break
            out.append((number, wire))
    except WireError:
        pass
    return out
