"""Field numbers of the part of Perfetto's published trace schema that the workbench reads and writes.

From `protos/perfetto/trace/perfetto_trace.proto` (google/perfetto, as shipped in the `perfetto` 0.59.1 Python
package's generated `perfetto_trace_pb2`): the numbers are part of the wire format and never change; the test
suite decodes our output with classes protoc generated from the same messages (`tests/data/perfetto/`).
"""

from __future__ import annotations

VARINT, I64, LEN, I32 = 0, 1, 2, 5
"""Protobuf wire types (3 and 4, groups, are not used by this schema)."""

TRACE_PACKET = 1
"""`Trace.packet`: the one repeated field of a trace file."""


class Packet:
    """`TracePacket`."""

    CLOCK_SNAPSHOT = 6
    TIMESTAMP = 8
    TRUSTED_SEQUENCE_ID = 10
    TRACK_EVENT = 11
    INTERNED_DATA = 12
    SEQUENCE_FLAGS = 13
    INCREMENTAL_STATE_CLEARED = 41
    TIMESTAMP_CLOCK_ID = 58
    TRACK_DESCRIPTOR = 60
    FIRST_PACKET_ON_SEQUENCE = 87


SEQ_INCREMENTAL_STATE_CLEARED, SEQ_NEEDS_INCREMENTAL_STATE = 1, 2
"""`TracePacket.SequenceFlags`."""


class Event:
    """`TrackEvent`."""

    CATEGORY_IIDS = 3
    DEBUG_ANNOTATIONS = 4
    TYPE = 9
    NAME_IID = 10
    TRACK_UUID = 11
    EXTRA_COUNTER_VALUES = 12
    CATEGORIES = 22
    NAME = 23
    COUNTER_VALUE = 30
    EXTRA_COUNTER_TRACK_UUIDS = 31
    FLOW_IDS_OLD = 36
    TERMINATING_FLOW_IDS_OLD = 42
    DOUBLE_COUNTER_VALUE = 44
    FLOW_IDS = 47
    TERMINATING_FLOW_IDS = 48


TYPE_SLICE_BEGIN, TYPE_SLICE_END, TYPE_INSTANT, TYPE_COUNTER = 1, 2, 3, 4
"""`TrackEvent.Type`."""


class Annotation:
    """`DebugAnnotation` (a name, or an interned one, and one value)."""

    NAME_IID = 1
    BOOL = 2
    UINT = 3
    INT = 4
    DOUBLE = 5
    STRING = 6
    POINTER = 7
    LEGACY_JSON = 9
    NAME = 10
    DICT_ENTRIES = 11
    ARRAY_VALUES = 12


class Track:
    """`TrackDescriptor`."""

    UUID = 1
    NAME = 2
    PROCESS = 3
    THREAD = 4
    PARENT_UUID = 5
    COUNTER = 8
    STATIC_NAME = 10


class Process:
    """`ProcessDescriptor`."""

    PID = 1
    PROCESS_NAME = 6


class Thread:
    """`ThreadDescriptor`."""

    PID = 1
    TID = 2
    THREAD_NAME = 5


class CounterDesc:
    """`CounterDescriptor`."""

    UNIT = 3
    UNIT_NAME = 6


UNIT_SIZE_BYTES = 3
"""`CounterDescriptor.Unit` of byte counts."""


class Interned:
    """`InternedData` (each entry an `EventName`, `EventCategory` or `DebugAnnotationName`: iid 1, name 2)."""

    EVENT_CATEGORIES = 1
    EVENT_NAMES = 2
    DEBUG_ANNOTATION_NAMES = 3
    IID = 1
    ENTRY_NAME = 2
