"""A bundle as a Perfetto protobuf trace (TrackEvent), written packet by packet.

Encoder: our own (`export.protowire`), see its docstring for why; field numbers from `trace.perfetto.fields`.
One packet sequence (trusted id 1): the first packet clears its incremental state, the track descriptors follow,
then the events in time order, each packet interning the event names and categories it is the first to use.

| bundle                    | TracePacket                                                                       |
|---------------------------|-----------------------------------------------------------------------------------|
| host lanes                | a process track per pid (`ProcessDescriptor`), a thread track per lane            |
|                           | (`ThreadDescriptor`, the lane's name as thread name)                              |
| device lanes              | a process track per device named by it (`cuda:0`), a named child track per lane   |
| events                    | TYPE_SLICE_BEGIN / TYPE_SLICE_END pairs (TrackEvent has no complete events), 0 ns |
|                           | ones TYPE_INSTANT; category from the kind (`export.categories`); the args as debug |
|                           | annotations, the columns in a `workbench` dictionary annotation                   |
| flows (launch → work)     | one flow id per pair: in the launch's `flow_ids`, the work's `terminating_flow_ids` |
| counters, memory totals   | counter tracks under their device (`memory allocated`, `memory reserved` in bytes) |

Slices on one track must nest to pair up: an event that overlaps another of its lane without nesting goes on a
sibling track `<lane> #2` (then `#3`...), so nothing is dropped or misnested.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import IO, Any

import numpy as np
import pyarrow as pa

from workbench.export import protowire as pw
from workbench.export.categories import category
from workbench.export.source import BATCH_ROWS, Lane, Source, args_object
from workbench.trace.perfetto.annotations import WORKBENCH_ANNOTATION
from workbench.trace.perfetto.fields import (
    SEQ_INCREMENTAL_STATE_CLEARED,
    SEQ_NEEDS_INCREMENTAL_STATE,
    TRACE_PACKET,
    TYPE_COUNTER,
    TYPE_INSTANT,
    TYPE_SLICE_BEGIN,
    TYPE_SLICE_END,
    UNIT_SIZE_BYTES,
    Annotation,
    CounterDesc,
    Event,
    Interned,
    Packet,
    Process,
    Thread,
    Track,
)
from workbench.trace.schema import KINDS

SEQUENCE = 1
DEVICE_PID = 2**31 - 1
"""Pids of the devices' process tracks, counting down (host pids are below `source.SYNTHETIC_PID` + lanes)."""
_INT64 = 2**63


def write_perfetto(source: Source, stream: IO[bytes], advance: Callable[[int], None]) -> dict[str, int]:
    """Write `source` as a Perfetto trace to the binary `stream`; `advance(n)` is told of each n events written."""
    writer = _Writer(source, stream)
    writer.descriptors()
    writer.events(advance)
    writer.counters()
    return {"events": source.events.num_rows, "flows": len(source.pairs), "counters": source.counters.num_rows,
            "memory": source.memory.num_rows}


def nest(lane: np.ndarray, start: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sub-lane, depth) of every event: on its lane's first sub-lane where it nests in the open slices, else on
    a new one."""
    n = len(start)
    sub = np.zeros(n, dtype=np.int32)
    depth = np.zeros(n, dtype=np.int32)
    order = np.lexsort((np.arange(n), -dur, start, lane))
    current = -1
    stacks: list[list[int]] = []
    for r, ln, s, e in zip(order.tolist(), lane[order].tolist(), start[order].tolist(),
                           (start + dur)[order].tolist(), strict=True):
        if ln != current:
            current, stacks = ln, []
        if e == s:
            continue
        for k, stack in enumerate(stacks):
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack or e <= stack[-1]:
                stack.append(e)
                sub[r], depth[r] = k, len(stack) - 1
                break
        else:
            stacks.append([e])
            sub[r] = len(stacks) - 1
    return sub, depth


class _Writer:
    def __init__(self, source: Source, stream: IO[bytes]) -> None:
        self.source = source
        self.stream = stream
        self.next_uuid = 1
        self.first = True
        self.process_uuid: dict[tuple[str, int], int] = {}
        self.lane_uuid: dict[tuple[int, int], int] = {}
        self.counter_uuid: dict[tuple[str, str], int] = {}
        self.names: dict[str, int] = {}
        self.categories: dict[str, int] = {}
        events = source.events
        self.start = events["start_ns"].to_numpy()
        self.dur = np.maximum(events["dur_ns"].to_numpy(), 0)
        self.sub, self.depth = nest(source.lane, self.start, self.dur)
        times = [int(self.start.min()) if len(self.start) else 0]
        for table, column in ((source.counters, "ts_ns"), (source.memory, "ts_ns")):
            if table.num_rows:
                times.append(int(table[column].to_numpy().min()))
        origin = source.metadata.get("origin_ns")
        base = origin if isinstance(origin, int) and not isinstance(origin, bool) and origin >= 0 else 0
        self.base = max(base, -min(times))
        if self.base + int((self.start + self.dur).max() if len(self.start) else 0) >= _INT64:
            self.base = -min(times)
        self.launch_flows: dict[int, list[int]] = {}
        self.work_flow: dict[int, int] = {}
        for i, (launch, work) in enumerate(source.pairs.tolist()):
            self.launch_flows.setdefault(launch, []).append(i + 1)
            self.work_flow[work] = i + 1

    # -- packets ------------------------------------------------------------------------------------

    def _packet(self, body: bytes, *, ts: int | None = None, interned: bytes = b"", needs_state: bool = False) -> None:
        head = pw.int_field(Packet.TIMESTAMP, ts + self.base) if ts is not None else b""
        flags = SEQ_INCREMENTAL_STATE_CLEARED if self.first else SEQ_NEEDS_INCREMENTAL_STATE if needs_state else 0
        self.first = False
        packet = head + pw.int_field(Packet.TRUSTED_SEQUENCE_ID, SEQUENCE) + body
        if interned:
            packet += pw.bytes_field(Packet.INTERNED_DATA, interned)
        if flags:
            packet += pw.int_field(Packet.SEQUENCE_FLAGS, flags)
        self.stream.write(pw.bytes_field(TRACE_PACKET, packet))

    def _track(self, descriptor: bytes) -> int:
        uuid = self.next_uuid
        self.next_uuid += 1
        self._packet(pw.bytes_field(Packet.TRACK_DESCRIPTOR, pw.int_field(Track.UUID, uuid) + descriptor))
        return uuid

    def _process(self, device: str, pid: int, name: str) -> int:
        key = (device, pid)
        if key not in self.process_uuid:
            process = pw.int_field(Process.PID, pid) + pw.str_field(Process.PROCESS_NAME, name)
            self.process_uuid[key] = self._track(pw.bytes_field(Track.PROCESS, process))
        return self.process_uuid[key]

    def _device(self, device: str) -> int:
        """The process track of an accelerator."""
        pids = {key[0]: key[1] for key in self.process_uuid if key[0] != "cpu"}
        pid = pids.get(device, DEVICE_PID - len(pids))
        return self._process(device, pid, device)

    def descriptors(self) -> None:
        processes = self.source.metadata.get("processes") or {}
        subs = {(int(ln), int(k)) for ln, k in zip(self.source.lane.tolist(), self.sub.tolist(), strict=True)}
        subs |= {(i, 0) for i in range(len(self.source.lanes))}
        for lane_index, k in sorted(subs):
            lane = self.source.lanes[lane_index]
            self.lane_uuid[lane_index, k] = self._lane_track(lane, k, processes)

    def _lane_track(self, lane: Lane, k: int, processes: dict[str, Any]) -> int:
        name = lane.name if k == 0 else f"{lane.name} #{k + 1}"
        if lane.on_device:
            parent = self._device(lane.device)
            return self._track(pw.int_field(Track.PARENT_UUID, parent) + pw.str_field(Track.NAME, name))
        known = processes.get(str(lane.pid))
        title = known.get("name") if isinstance(known, dict) and known.get("name") else lane.pid_name
        parent = self._process("cpu", lane.pid, str(title or f"process {lane.pid}"))
        if k:
            return self._track(pw.int_field(Track.PARENT_UUID, parent) + pw.str_field(Track.NAME, name))
        thread = (pw.int_field(Thread.PID, lane.pid) + pw.int_field(Thread.TID, lane.tid)
                  + pw.str_field(Thread.THREAD_NAME, name))
        return self._track(pw.bytes_field(Track.THREAD, thread))

    def _counter_track(self, device: str, name: str, unit_bytes: bool = False) -> int:
        key = (device, name)
        if key not in self.counter_uuid:
            counter = pw.int_field(CounterDesc.UNIT, UNIT_SIZE_BYTES) if unit_bytes else b""
            parent = pw.int_field(Track.PARENT_UUID, self._device(device)) if device != "cpu" else b""
            self.counter_uuid[key] = self._track(parent + pw.str_field(Track.NAME, name)
                                                 + pw.bytes_field(Track.COUNTER, counter))
        return self.counter_uuid[key]

    # -- events -------------------------------------------------------------------------------------

    def events(self, advance: Callable[[int], None]) -> None:
        n = len(self.start)
        timed = self.dur > 0
        ends = np.flatnonzero(timed)
        ts = np.concatenate([self.start, self.start[ends] + self.dur[ends]])
        phase = np.concatenate([np.ones(n, np.int8), np.zeros(len(ends), np.int8)])
        depth_key = np.concatenate([np.where(timed, self.depth, 1 << 20), -self.depth[ends]])
        rows = np.concatenate([np.arange(n), ends])
        order = np.lexsort((depth_key, phase, ts))
        vendor = self.source.vendor
        for at in range(0, len(order), BATCH_ROWS):
            chunk = order[at:at + BATCH_ROWS]
            begins = rows[chunk[chunk < n]]
            data = dict(zip(begins.tolist(), self.source.events.take(pa.array(begins)).to_pylist(), strict=True)) \
                if len(begins) else {}
            for entry in chunk.tolist():
                row = int(rows[entry])
                uuid = self.lane_uuid[int(self.source.lane[row]), int(self.sub[row])]
                if entry >= n:
                    self._packet(pw.bytes_field(Packet.TRACK_EVENT, pw.int_field(Event.TYPE, TYPE_SLICE_END)
                                                + pw.int_field(Event.TRACK_UUID, uuid)),
                                 ts=int(ts[entry]), needs_state=True)
                else:
                    self._begin(row, data[row], uuid, bool(timed[row]), vendor)
            advance(len(begins))

    def _begin(self, row: int, record: dict[str, Any], uuid: int, timed: bool, vendor: str) -> None:
        interned = b""
        name = record["name"] or ""
        if name not in self.names:
            self.names[name] = len(self.names) + 1
            interned += pw.bytes_field(Interned.EVENT_NAMES, pw.int_field(Interned.IID, self.names[name])
                                       + pw.str_field(Interned.ENTRY_NAME, name))
        lane = self.source.lanes[int(self.source.lane[row])]
        kind = record["kind"] if record["kind"] in KINDS else "other"
        cat = category(kind, lane.on_device, vendor)
        if cat not in self.categories:
            self.categories[cat] = len(self.categories) + 1
            interned += pw.bytes_field(Interned.EVENT_CATEGORIES, pw.int_field(Interned.IID, self.categories[cat])
                                       + pw.str_field(Interned.ENTRY_NAME, cat))
        body = (pw.int_field(Event.TYPE, TYPE_SLICE_BEGIN if timed else TYPE_INSTANT)
                + pw.int_field(Event.TRACK_UUID, uuid) + pw.int_field(Event.NAME_IID, self.names[name])
                + pw.int_field(Event.CATEGORY_IIDS, self.categories[cat]))
        for flow in self.launch_flows.get(row, ()):
            body += pw.fixed64_field(Event.FLOW_IDS, flow)
        if row in self.work_flow:
            body += pw.fixed64_field(Event.TERMINATING_FLOW_IDS, self.work_flow[row])
        args = args_object(record["args"])
        if record["corr"] >= 0 and record["corr"] != self.source.corr_out[row]:
            args["source correlation"] = record["corr"]
        for key, value in args.items():
            body += pw.bytes_field(Event.DEBUG_ANNOTATIONS, annotation(key, value))
        columns = self._columns(row, record)
        if columns:
            entries = b"".join(pw.bytes_field(Annotation.DICT_ENTRIES, annotation(k, v)) for k, v in columns.items())
            note = pw.str_field(Annotation.NAME, WORKBENCH_ANNOTATION) + entries
            body += pw.bytes_field(Event.DEBUG_ANNOTATIONS, note)
        self._packet(pw.bytes_field(Packet.TRACK_EVENT, body), ts=int(self.start[row]), interned=interned,
                     needs_state=True)

    def _columns(self, row: int, record: dict[str, Any]) -> dict[str, Any]:
        """The event's columns that have a value, for the `workbench` annotation."""
        out: dict[str, Any] = {}
        corr = int(self.source.corr_out[row])
        if corr >= 0:
            out["correlation"] = corr
        for key in ("flops", "bytes"):
            if record[key] is not None and not math.isnan(record[key]):
                out[key] = float(record[key])
        for key in ("shapes", "dtypes"):
            if record[key] is not None:
                out[key] = record[key]
        return out

    def counters(self) -> None:
        source = self.source
        for table, series in ((source.counters, None), (source.memory, ("allocated_bytes", "reserved_bytes"))):
            if not table.num_rows:
                continue
            columns = ["ts_ns", "device", *(series or ("name", "value"))]
            for batch in table.select(columns).to_batches(max_chunksize=65536):
                values = [batch.column(i).to_pylist() for i in range(len(columns))]
                for ts, device, *rest in zip(*values, strict=True):
                    if series is None:
                        self._count(ts, self._counter_track(device, rest[0]), rest[1])
                        continue
                    for label, value in zip(("memory allocated", "memory reserved"), rest, strict=True):
                        if value >= 0:
                            self._count(ts, self._counter_track(device, label, unit_bytes=True), float(value))

    def _count(self, ts: int, uuid: int, value: float) -> None:
        if not math.isfinite(value):
            return
        body = (pw.int_field(Event.TYPE, TYPE_COUNTER) + pw.int_field(Event.TRACK_UUID, uuid)
                + pw.double_field(Event.DOUBLE_COUNTER_VALUE, value))
        self._packet(pw.bytes_field(Packet.TRACK_EVENT, body), ts=ts)


def annotation(name: str, value: Any) -> bytes:
    """A DebugAnnotation: numbers, booleans and strings typed, anything else as JSON (`legacy_json_value`)."""
    head = pw.str_field(Annotation.NAME, name)
    if isinstance(value, bool):
        return head + pw.int_field(Annotation.BOOL, int(value))
    if isinstance(value, int) and -_INT64 <= value < _INT64:
        return head + pw.int_field(Annotation.INT, value)
    if isinstance(value, float) and math.isfinite(value):
        return head + pw.double_field(Annotation.DOUBLE, value)
    if isinstance(value, str):
        return head + pw.str_field(Annotation.STRING, value)
    return head + pw.str_field(Annotation.LEGACY_JSON, json.dumps(value, default=str))
