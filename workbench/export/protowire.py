"""Protobuf wire encoding, the few primitives a Perfetto trace needs, in plain Python.

Why hand-written rather than protobuf's generated classes: the workbench does not depend on protobuf (only some
extras bring it), the `perfetto` package's `perfetto_trace_pb2` is a 600 KB module of the whole schema generated
for one protobuf major version, and a trace is written one small packet at a time, which a few byte joins do as
fast as building message objects. The test suite decodes what these write with classes protoc generated from
Perfetto's published `.proto`, so the encoding is checked against the schema, not against itself.
"""

from __future__ import annotations

import struct

from workbench.trace.perfetto.fields import I64, LEN, VARINT


def varint(value: int) -> bytes:
    """`value` as a varint (a negative one as its 64-bit two's complement, ten bytes, as protobuf's int64)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def key(number: int, wire: int) -> bytes:
    """A field's key: its number and wire type."""
    return varint(number << 3 | wire)


def int_field(number: int, value: int) -> bytes:
    """A varint field (int32, int64, uint64, enum, bool)."""
    return key(number, VARINT) + varint(value)


def bytes_field(number: int, value: bytes) -> bytes:
    """A length-delimited field: a string's UTF-8 bytes or an encoded message."""
    return key(number, LEN) + varint(len(value)) + value


def str_field(number: int, value: str) -> bytes:
    """A string field."""
    return bytes_field(number, value.encode("utf-8", errors="replace"))


def double_field(number: int, value: float) -> bytes:
    """A double field."""
    return key(number, I64) + struct.pack("<d", value)


def fixed64_field(number: int, value: int) -> bytes:
    """A fixed64 field (Perfetto's flow ids)."""
    return key(number, I64) + struct.pack("<Q", value)
