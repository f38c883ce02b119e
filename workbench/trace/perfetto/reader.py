"""Reader of Perfetto protobuf traces (`.perfetto-trace`, `.pftrace`, `.pb`; gzip too) into a `Trace`.

Packet by packet (`wire.packets`: the file is never held whole), TrackEvent data becomes the Trace tables:

| packet content                                 | goes to                                                   |
|------------------------------------------------|-----------------------------------------------------------|
| `track_descriptor` (process, thread, custom,   | devices and track labels (`perfetto.tracks`); counter      |
| counter tracks)                                | tracks name the `counters` series                         |
| `track_event` TYPE_SLICE_BEGIN / END pairs     | `events` spans, paired per track (an END closes the       |
|                                                | innermost open slice of its track)                        |
| TYPE_INSTANT                                   | `events` rows of 0 duration                               |
| TYPE_COUNTER, `extra_counter_values`           | `counters` rows (device and name from the counter track)  |
| `flow_ids` / `terminating_flow_ids`            | `corr`: events sharing a flow share a correlation id, so  |
|                                                | launches link to their kernels (`workbench.trace.launches`)|
| `interned_data` (event names, categories,      | names of later packets on the same sequence, cleared with |
| annotation names)                              | SEQ_INCREMENTAL_STATE_CLEARED                             |
| debug annotations                              | `args` (JSON); the `workbench` dict of our own exports    |
|                                                | gives the flops, bytes, shapes, dtypes, correlation columns|
| anything else (ftrace, process trees...)       | not rows: counted in `metadata.reader.skipped`            |

Kinds come from the first category as in Kineto (`kineto.categories.kind_of`: `kernel`, `cpu_op`,
`cuda_runtime`...); an event without a category is an `annotation` (app instrumentation), one of an unknown
category `other` with the category in args. Timestamps are taken as the ns they are written in (the default
clock); the origin is the earliest event or counter. A slice never ended ends at the trace's last timestamp
(counted); an END with nothing open is counted and dropped.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from workbench.errors import TraceFormatError
from workbench.trace import schema
from workbench.trace.columns import dict_array, encode_strings
from workbench.trace.kineto.categories import kind_of
from workbench.trace.kineto.reader import open_trace_file
from workbench.trace.launches import launchers
from workbench.trace.model import Trace
from workbench.trace.nesting import nest_spans
from workbench.trace.perfetto.annotations import annotations
from workbench.trace.perfetto.fields import (
    LEN,
    SEQ_INCREMENTAL_STATE_CLEARED,
    TYPE_COUNTER,
    TYPE_INSTANT,
    TYPE_SLICE_BEGIN,
    TYPE_SLICE_END,
    VARINT,
    CounterDesc,
    Event,
    Interned,
    Packet,
    Process,
    Thread,
    Track,
)
from workbench.trace.perfetto.tracks import TrackInfo, Tracks
from workbench.trace.perfetto.wire import (
    WireError,
    as_double,
    fields,
    packed,
    packed_fixed64,
    packets,
    signed,
    varint,
    whole_fields,
)
from workbench.trace.progress import advance_in_file
from workbench.trace.schema import KIND_CODES, TIME_LIMIT_NS

KNOWN_PACKET_FIELDS = {Packet.TIMESTAMP: VARINT, Packet.TRUSTED_SEQUENCE_ID: VARINT, Packet.TRACK_EVENT: LEN,
                       Packet.TRACK_DESCRIPTOR: LEN, Packet.INTERNED_DATA: LEN, Packet.SEQUENCE_FLAGS: VARINT,
                       Packet.CLOCK_SNAPSHOT: LEN, 1: LEN, 2: LEN}
"""TracePacket fields and their wire types that a sniff checks (1, 2: ftrace events and process trees)."""

UNENDED = "slices never ended (ended at the trace's last timestamp)"
STRAY_END = "slice ends with no open slice on their track (dropped)"
OTHER_PACKETS = "packets of other data sources (ftrace, process trees, system info...: not rows)"
UNKNOWN_TYPE = "track events of an unknown type (dropped)"
FAR_TS = "track events whose timestamp is out of range, |ts| >= 2^62 ns (dropped; a slice they end never ends)"
NOT_COUNTER = "counter values on a track that is no counter track (kept, on that track's name)"


def looks_like_perfetto(head: bytes) -> bool:
    """Whether `head` starts a `Trace`: field 1 holding a packet whose whole fields within `head` parse, one of
    them at least a known TracePacket field with its wire type and none a known one with another. An XSpace
    (field 1 holding a plane that starts with its id, a varint field 1) is not one."""
    if head[:1] != b"\x0a":
        return False
    try:
        size, at = varint(head, 1)
    except WireError:
        return False
    body = head[at:at + size]
    if not body or body[:1] == b"\x08":
        return False
    if body[:1] == b"\x12" and not _nested_message(body):  # an XPlane's name, not a process tree
        return False
    seen = 0
    for number, wire in whole_fields(body):
        expected = KNOWN_PACKET_FIELDS.get(number)
        if expected is not None and expected != wire:
            return False
        seen += expected is not None
    return seen > 0


def _nested_message(body: bytes) -> bool:
    """Whether the first field of `body` (length-delimited) holds bytes that parse as a message (as far as the
    sniff window shows them)."""
    try:
        size, at = varint(body, 1)
    except WireError:
        return False
    return bool(whole_fields(body[at:at + size]))


def read_perfetto(path: str | os.PathLike[str]) -> Trace:
    """Read a Perfetto protobuf trace into a `Trace` (see the module docstring); TraceFormatError names the file
    and the problem for input that is not one, or is cut off or corrupt."""
    path = Path(path)
    decoder = _Decoder()
    with open_trace_file(path) as stream:
        count = 0
        try:
            for offset, packet in packets(stream):
                try:
                    decoder.packet(packet)
                except WireError as exc:
                    raise WireError(f"packet at offset {offset:,}: {exc}") from None
                count += 1
                if count % 65536 == 0:
                    advance_in_file(path, stream)
        except WireError as exc:
            raise TraceFormatError(path, f"not a readable Perfetto trace: {exc}") from None
    if not count:
        raise TraceFormatError(path, "an empty Perfetto trace (no packets)")
    return decoder.trace(path, count)


class _Sequence:
    """The incremental state of one packet sequence: interned names and the default track."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self.categories: dict[int, str] = {}
        self.annotation_names: dict[int, str] = {}


class _Decoder:
    """Turns packets into rows, then the rows into the Trace tables."""

    def __init__(self) -> None:
        self.tracks = Tracks()
        self.sequences: dict[int, _Sequence] = {}
        self.skipped: Counter[str] = Counter()
        self.start: list[int] = []
        self.dur: list[int] = []
        self.name: list[str] = []
        self.category: list[str | None] = []
        self.track: list[int] = []
        self.flows: dict[int, list[int]] = {}
        self.corr: list[int] = []
        self.columns: list[dict[str, Any] | None] = []
        self.args: list[str | None] = []
        self.open: dict[int, list[int]] = {}
        self.counters: list[tuple[int, int, float]] = []
        self.last_ts = -TIME_LIMIT_NS

    def packet(self, data: bytes) -> None:
        ts, seq_id, event, descriptor, interned, flags = None, 0, None, None, None, 0
        for number, wire, value in fields(data):
            if number == Packet.TIMESTAMP and wire == VARINT:
                ts = signed(int(value))  # type: ignore[arg-type]
            elif number == Packet.TRUSTED_SEQUENCE_ID and wire == VARINT:
                seq_id = int(value)  # type: ignore[arg-type]
            elif number == Packet.TRACK_EVENT and wire == LEN:
                event = value
            elif number == Packet.TRACK_DESCRIPTOR and wire == LEN:
                descriptor = value
            elif number == Packet.INTERNED_DATA and wire == LEN:
                interned = value
            elif number == Packet.SEQUENCE_FLAGS and wire == VARINT:
                flags = int(value)  # type: ignore[arg-type]
            elif number == Packet.INCREMENTAL_STATE_CLEARED and wire == VARINT and value:
                flags |= SEQ_INCREMENTAL_STATE_CLEARED
        if flags & SEQ_INCREMENTAL_STATE_CLEARED or seq_id not in self.sequences:
            self.sequences[seq_id] = _Sequence()
        sequence = self.sequences[seq_id]
        if interned is not None:
            self._intern(sequence, interned)
        if descriptor is not None:
            self._descriptor(descriptor)
        if event is not None:
            self._event(sequence, event, ts or 0)
        elif descriptor is None and interned is None:
            self.skipped[OTHER_PACKETS] += 1

    def _intern(self, sequence: _Sequence, data: bytes) -> None:
        tables = {Interned.EVENT_NAMES: sequence.names, Interned.EVENT_CATEGORIES: sequence.categories,
                  Interned.DEBUG_ANNOTATION_NAMES: sequence.annotation_names}
        for number, wire, value in fields(data):
            table = tables.get(number)
            if table is None or wire != LEN:
                continue
            iid, name = 0, ""
            for n, w, v in fields(value):  # type: ignore[arg-type]
                if n == Interned.IID and w == VARINT:
                    iid = int(v)  # type: ignore[arg-type]
                elif n == Interned.ENTRY_NAME and w == LEN:
                    name = _text(v)
            table[iid] = name

    def _descriptor(self, data: bytes) -> None:
        uuid, info = 0, TrackInfo()
        for number, wire, value in fields(data):
            if number == Track.UUID and wire == VARINT:
                uuid = int(value)  # type: ignore[arg-type]
            elif number in (Track.NAME, Track.STATIC_NAME) and wire == LEN:
                info.name = _text(value)
            elif number == Track.PARENT_UUID and wire == VARINT:
                info.parent = int(value)  # type: ignore[arg-type]
            elif number == Track.PROCESS and wire == LEN:
                info.process = True
                for n, w, v in fields(value):  # type: ignore[arg-type]
                    if n == Process.PID and w == VARINT:
                        info.pid = signed(int(v))  # type: ignore[arg-type]
                    elif n == Process.PROCESS_NAME and w == LEN and info.name is None:
                        info.name = _text(v)
            elif number == Track.THREAD and wire == LEN:
                info.thread = True
                for n, w, v in fields(value):  # type: ignore[arg-type]
                    if n == Thread.PID and w == VARINT:
                        info.pid = signed(int(v))  # type: ignore[arg-type]
                    elif n == Thread.TID and w == VARINT:
                        info.tid = signed(int(v))  # type: ignore[arg-type]
                    elif n == Thread.THREAD_NAME and w == LEN and info.name is None:
                        info.name = _text(v)
            elif number == Track.COUNTER and wire == LEN:
                info.counter = True
                for n, w, v in fields(value):  # type: ignore[arg-type]
                    if n == CounterDesc.UNIT_NAME and w == LEN:
                        info.unit = _text(v)
        self.tracks.describe(uuid, info)

    def _event(self, sequence: _Sequence, data: bytes, ts: int) -> None:
        kind, track, name, category = 0, 0, None, None
        flows: list[int] = []
        counter: float | None = None
        extra_tracks: list[int] = []
        extra_values: list[int] = []
        notes: list[bytes] = []
        for number, wire, value in fields(data):
            if number == Event.TYPE and wire == VARINT:
                kind = int(value)  # type: ignore[arg-type]
            elif number == Event.TRACK_UUID and wire == VARINT:
                track = int(value)  # type: ignore[arg-type]
            elif number == Event.NAME and wire == LEN:
                name = _text(value)
            elif number == Event.NAME_IID and wire == VARINT:
                name = sequence.names.get(int(value), f"name {value}")  # type: ignore[arg-type]
            elif number == Event.CATEGORIES and wire == LEN and category is None:
                category = _text(value)
            elif number == Event.CATEGORY_IIDS and category is None:
                iids = packed(value, wire)
                category = sequence.categories.get(iids[0]) if iids else None
            elif number in (Event.FLOW_IDS, Event.TERMINATING_FLOW_IDS):
                flows += packed_fixed64(value, wire)
            elif number in (Event.FLOW_IDS_OLD, Event.TERMINATING_FLOW_IDS_OLD):
                flows += packed(value, wire)
            elif number == Event.COUNTER_VALUE and wire == VARINT:
                counter = float(signed(int(value)))  # type: ignore[arg-type]
            elif number == Event.DOUBLE_COUNTER_VALUE and wire == 1:
                counter = as_double(int(value))  # type: ignore[arg-type]
            elif number == Event.EXTRA_COUNTER_TRACK_UUIDS:
                extra_tracks += packed(value, wire)
            elif number == Event.EXTRA_COUNTER_VALUES:
                extra_values += [signed(v) for v in packed(value, wire)]
            elif number == Event.DEBUG_ANNOTATIONS and wire == LEN:
                notes.append(value)  # type: ignore[arg-type]
        if not -TIME_LIMIT_NS < ts < TIME_LIMIT_NS:
            self.skipped[FAR_TS] += 1
            return
        self.last_ts = max(self.last_ts, ts)
        for uuid, extra in zip(extra_tracks, extra_values, strict=False):
            self._counter(ts, uuid, float(extra))
        if kind == TYPE_COUNTER:
            if counter is not None:
                self._counter(ts, track, counter)
            return
        if kind == TYPE_SLICE_END:
            stack = self.open.get(track)
            if not stack:
                self.skipped[STRAY_END] += 1
                return
            row = stack.pop()
            self.dur[row] = max(ts - self.start[row], 0)
            self._flows(row, flows)
            return
        if kind not in (TYPE_SLICE_BEGIN, TYPE_INSTANT):
            self.skipped[UNKNOWN_TYPE] += 1
            return
        if track not in self.tracks.info:
            self.tracks.describe(track, TrackInfo())
        args, columns = annotations(notes, sequence.annotation_names) if notes else ({}, None)
        row = len(self.start)
        self.start.append(ts)
        self.dur.append(0)
        self.name.append(name if name is not None else "")
        self.category.append(category)
        self.track.append(track)
        corr = columns.get("correlation") if columns else args.get("correlation")
        self.corr.append(corr if isinstance(corr, int) and not isinstance(corr, bool) and corr >= 0 else -1)
        self.columns.append(columns)
        if category is not None and kind_of(category, "") == "other":
            args = {"cat": category, **args}
        self.args.append(json.dumps(args, separators=(",", ":")) if args else None)
        self._flows(row, flows)
        if kind == TYPE_SLICE_BEGIN:
            self.open.setdefault(track, []).append(row)

    def _flows(self, row: int, flows: list[int]) -> None:
        if flows:
            self.flows.setdefault(row, []).extend(flows)

    def _counter(self, ts: int, uuid: int, value: float) -> None:
        info = self.tracks.info.get(uuid)
        if info is None or not info.counter:
            self.skipped[NOT_COUNTER] += 1
        self.counters.append((ts, uuid, value))

    def trace(self, path: Path, count: int) -> Trace:
        for stack in self.open.values():
            for row in stack:
                self.dur[row] = max(self.last_ts - self.start[row], 0)
                self.skipped[UNENDED] += 1
        for _, uuid, _ in self.counters:
            if uuid not in self.tracks.info:
                self.tracks.describe(uuid, TrackInfo())
        resolved = self.tracks.resolve()
        times = self.start + [ts for ts, _, _ in self.counters]
        origin = min(times) if times else 0
        events = self._events(resolved, origin)
        counters = _counters(self.counters, resolved, self.tracks, origin)
        devices = sorted({device for device, *_ in resolved.values()} - {"cpu"})
        return Trace(events=events, counters=counters, metadata={
            "source": {"format": "perfetto", "file": str(path), "bytes": path.stat().st_size},
            "origin_ns": origin,
            "devices": [{"device": d} for d in devices],
            "reader": {"records": count, "events": events.num_rows, "memory": 0, "counters": counters.num_rows,
                       "skipped": {k: v for k, v in self.skipped.items() if v}, "warnings":
                       [] if events.num_rows else ["no trace events: the trace holds no slices or instants"]},
        })

    def _events(self, resolved: dict[int, tuple[str, str, int, int]], origin: int) -> pa.Table:
        n = len(self.start)
        start = np.asarray(self.start, dtype=np.int64) - origin
        dur = np.asarray(self.dur, dtype=np.int64)
        uuids = np.asarray(self.track, dtype=np.uint64) if n else np.zeros(0, np.uint64)
        order = sorted(set(self.track))
        codes = np.searchsorted(np.asarray(order, dtype=np.uint64), uuids).astype(np.int32)
        labels = [resolved[u][1] for u in order]
        device_of = [resolved[u][0] for u in order]
        device_values = sorted(set(device_of))
        device_codes = np.asarray([device_values.index(d) for d in device_of] or [0], dtype=np.int32)[codes] \
            if n else np.zeros(0, np.int32)
        pid = np.asarray([resolved[u][2] for u in order] or [0], dtype=np.int64)[codes] if n else np.zeros(0, np.int64)
        tid = np.asarray([resolved[u][3] for u in order] or [0], dtype=np.int64)[codes] if n else np.zeros(0, np.int64)
        kind = np.asarray([KIND_CODES["annotation"] if c is None else KIND_CODES[kind_of(c, nm)]
                           for c, nm in zip(self.category, self.name, strict=True)], dtype=np.int8)
        corr = np.asarray(self.corr, dtype=np.int64)
        _flow_correlations(self.flows, corr)
        parent, depth = nest_spans(codes, start, dur)
        launcher = launchers(kind, corr, parent)
        columns = self.columns
        name_codes, name_values = encode_strings(self.name)
        return pa.table({
            "start_ns": start, "dur_ns": dur,
            "name": dict_array(name_codes, name_values),
            "kind": dict_array(kind, list(schema.KINDS)),
            "device": dict_array(device_codes, device_values),
            "track": dict_array(codes, labels),
            "pid": pid, "tid": tid, "corr": corr, "parent": parent, "depth": depth, "launcher": launcher,
            "flops": _column(columns, "flops", float), "bytes": _column(columns, "bytes", float),
            "shapes": _column(columns, "shapes", str), "dtypes": _column(columns, "dtypes", str),
            "args": pa.array(self.args, pa.string()),
        }, schema=schema.EVENTS)


def _flow_correlations(flows: dict[int, list[int]], corr: np.ndarray) -> None:
    """Give the rows without a correlation id that flows connect one each, past the ids written: the rows of one
    flow share it, and a row in several flows (a launch fanning out to kernels) joins them into one group."""
    base = int(corr.max()) + 1 if len(corr) else 0
    group: dict[int, int] = {}
    groups = 0
    for row in sorted(flows):
        ids = flows[row]
        known = next((group[f] for f in ids if f in group), None)
        chosen = known if known is not None else groups
        groups += known is None
        for f in ids:
            group.setdefault(f, chosen)
        if corr[row] < 0:
            corr[row] = base + chosen


def _column(columns: list[dict[str, Any] | None], key: str, kind: type) -> Any:
    """One of the columns our exports carry in the `workbench` annotation (NaN or null where absent)."""
    if kind is float:
        return np.asarray([float(c[key]) if c and isinstance(c.get(key), (int, float)) else np.nan for c in columns],
                          dtype=np.float64)
    return pa.array([c[key] if c and isinstance(c.get(key), str) else None for c in columns], pa.string())


def _counters(rows: list[tuple[int, int, float]], resolved: dict[int, tuple[str, str, int, int]], tracks: Tracks,
              origin: int) -> pa.Table:
    """The counters table: each counter track's values, named by the track's own name (its label without the
    device), on the track's device."""
    if not rows:
        return schema.COUNTERS.empty_table()
    ts, uuids, values = zip(*rows, strict=True)
    device = [resolved[u][0] for u in uuids]
    name = [tracks.info[u].name or resolved[u][1] for u in uuids]
    return pa.table({"ts_ns": np.asarray(ts, dtype=np.int64) - origin,
                     "device": pa.array(device).dictionary_encode(), "name": pa.array(name).dictionary_encode(),
                     "value": np.asarray(values, dtype=np.float64)}, schema=schema.COUNTERS)


def _text(value: int | bytes) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)

