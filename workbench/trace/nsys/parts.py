"""The event tables of an Nsight Systems export as `Part`s: each table's rows in the events' terms
(name, thread or stream, correlation id, args), times still on nsys's clock, for `workbench.trace.nsys.reader`
to put together into the Trace (its docstring says what each table becomes)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from workbench.errors import TraceFormatError
from workbench.trace.columns import dict_array, factorize, group_codes, json_labels, json_values, lookup
from workbench.trace.nsys.tables import (
    KERNELS,
    MEMCPY,
    MEMSET,
    NVTX,
    OVERHEAD,
    RUNTIME,
    SYNCHRONIZATION,
    NsysExport,
    Rows,
    combine,
    global_ids,
    ints,
    process_ids,
    thread_ids,
)
from workbench.trace.progress import advance

_HOST_CALLS = (  # (table, kind): API calls on a host thread, named through nameId
    (RUNTIME, "runtime"),
    ("OSRT_API", "other"),
    ("CUBLAS_EVENTS", "other"),
    ("CUDNN_EVENTS", "other"),
    (OVERHEAD, "other"),
)
_DEVICE_COLUMNS = ("start", "end", "deviceId", "streamId", "correlationId", "globalPid", "globalTid")
_LAUNCH_CONFIGURATION = ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread",
                         "staticSharedMemory", "dynamicSharedMemory")
_CUDA_BACKTRACE = 67  # ENUM_NSYS_EVENT_CLASS id of CUDA backtrace records, stable across nsys versions
_PUSH_POP = ("NvtxPushPopRange", "NvtxtPushPopRange")
_START_END = ("NvtxStartEndRange", "NvtxtStartEndRange")
_MARKS = ("NvtxMark", "NvtxtMark")
_EMIT_NVTX = (r"(?s)^(?P<name>.*?)(?:, seq = (?P<seq>-?\d+))?(?:, op_id = (?P<op_id>\d+))?"
              r"(?:, sizes = (?P<sizes>\[.*?\]))?(?:, input_op_ids = (?P<input_op_ids>\[.*\]))?$")
_API_VERSION = re.compile(r"_v\d+$")

LANES = ("", "/nvtx start-end")
"""Suffixes of a thread's track by `Part.lane`: its own lane, and one for NVTX start/end ranges (which need
not nest)."""


@dataclass
class Part:
    """Rows of one source table in the events' terms (times still on nsys's clock)."""

    kind: str
    start: np.ndarray
    end: np.ndarray
    name: pa.Array
    pid: np.ndarray
    tid: np.ndarray  # the thread on the host, the stream on a device
    device: np.ndarray  # CUDA device id, -1 on the host
    corr: np.ndarray
    args: pa.Array
    bytes: np.ndarray | None = None
    shapes: pa.Array | None = None
    lane: np.ndarray | None = None  # index into LANES: a sub-lane of the thread's track
    encloses: bool = False  # NVTX push/pop ranges: candidates for a launch's enclosing range

    def __len__(self) -> int:
        return len(self.start)


class TableParts:
    """Reads the event tables of one export into `Part`s, counting what it leaves out in `skipped`."""

    def __init__(self, db: NsysExport, skipped: Counter[str]) -> None:
        self.db = db
        self.skipped = skipped

    def read(self) -> list[Part]:
        """Parts of every event table: device work, host API calls, synchronization, NVTX (each table's
        progress reported, `workbench.trace.progress`)."""
        steps: list[Callable[[], Part]] = [self._kernels, self._memcpy, self._memset,
                                           *(partial(self._host_calls, table, kind) for table, kind in _HOST_CALLS)]
        total = len(steps) + 2
        parts = []
        for done, step in enumerate(steps):
            advance(self.db.path, done, total, "tables")
            parts.append(step())
        advance(self.db.path, len(steps), total, "tables")
        synchronization = self._synchronization(parts[3])
        advance(self.db.path, len(steps) + 1, total, "tables")
        return [*parts, synchronization, *self._nvtx()]

    # -- device work ------------------------------------------------------------------------------

    def _kernels(self) -> Part:
        names = ("demangledName", "shortName", "mangledName")
        rows = self.db.rows(KERNELS, (*_DEVICE_COLUMNS, *names), ("start", "end", "deviceId", "streamId"),
                            grouped=_LAUNCH_CONFIGURATION)
        t = rows.mapped
        present = [combine(t[c]) for c in names if c in t.column_names]
        if not present:
            raise TraceFormatError(self.db.path, f"table {KERNELS} has no kernel name column "
                                                 "(demangledName, shortName)")
        first = {c: json_labels(*self.db.strings(t[c])) for c in names[1:] if c in t.column_names}
        name = dict_array(*self.db.strings(pc.coalesce(*present)))
        return self._device_part("kernel", rows, name, self.db.args(rows, first, _launch_configuration))

    def _memcpy(self) -> Part:
        rows = self.db.rows(MEMCPY, (*_DEVICE_COLUMNS, "bytes", "copyKind"), ("start", "end", "deviceId", "streamId",
                                                                             "bytes"))
        first = {}
        if "copyKind" in rows.mapped.column_names:
            codes, kinds = self.db.labels(self.db.reference(MEMCPY, "copyKind"), rows.mapped["copyKind"])
            name = dict_array(codes, [f"[CUDA memcpy {k}]" for k in kinds])
            first["copyKind"] = json_labels(codes, kinds)
        else:
            name = dict_array(np.zeros(rows.num_rows, np.int32), ["[CUDA memcpy]"])
        return self._device_part("memcpy", rows, name, self.db.args(rows, first),
                                 ints(rows.mapped, "bytes").astype(float))

    def _memset(self) -> Part:
        rows = self.db.rows(MEMSET, (*_DEVICE_COLUMNS, "bytes"), ("start", "end", "deviceId", "streamId", "bytes"))
        name = dict_array(np.zeros(rows.num_rows, np.int32), ["[CUDA memset]"])
        return self._device_part("memset", rows, name, self.db.args(rows), ints(rows.mapped, "bytes").astype(float))

    @staticmethod
    def _device_part(kind: str, rows: Rows, name: pa.Array, args: pa.Array, size: np.ndarray | None = None) -> Part:
        t = rows.mapped
        pid = process_ids(t)
        return Part(kind, ints(t, "start"), ints(t, "end"), name, pid, ints(t, "streamId"),
                    ints(t, "deviceId"), ints(t, "correlationId"), args, bytes=size)

    # -- host threads -----------------------------------------------------------------------------

    def _host_calls(self, table: str, kind: str) -> Part:
        """API calls named through nameId (the overhead table names some by their overheadType only)."""
        runtime = table == RUNTIME
        rows = self.db.rows(table, ("start", "end", "globalTid", "globalPid", "nameId", "correlationId",
                                    "overheadType", *(("eventClass", "callchainId") if runtime else ())),
                            ("start", "end"))
        rows, runtime_args = self._without_backtraces(rows) if runtime else (rows, {})
        t, n = rows.mapped, rows.num_rows
        codes, names = self.db.strings(t["nameId"]) if "nameId" in t.column_names else (np.full(n, -1, np.int32), [])
        first: dict[str, pa.Array] = {}
        if runtime:
            first["symbol"] = json_labels(codes, names)
            first.update(runtime_args)
            names = [_API_VERSION.sub("", v) for v in names]
        else:
            first["source"] = json_labels(np.zeros(n, np.int32), [table])
        if "overheadType" in t.column_names:
            overhead, labels = self.db.labels(self.db.reference(table, "overheadType"), t["overheadType"])
            first["overheadType"] = json_labels(overhead, labels)
            if (codes < 0).any():
                codes = np.where(codes < 0, overhead + len(names), codes)
                names = names + labels
        pid, tid = thread_ids(t)
        return Part(kind, ints(t, "start"), ints(t, "end"), dict_array(codes, names), pid, tid,
                    np.full(n, -1), ints(t, "correlationId"), self.db.args(rows, first))

    def _without_backtraces(self, rows: Rows) -> tuple[Rows, dict[str, pa.Array]]:
        """CUDA API rows less the CUDA backtrace records (nsys 2022) that repeat a call on the same thread
        with the same correlation id to carry its call stack: counted, their callchainId given to the call.
        Returns the rows and their `eventClass` and `callchainId` args."""
        t = rows.mapped
        event_class, corr = ints(t, "eventClass"), ints(t, "correlationId")
        callchain = ints(t, "callchainId").copy()
        backtraces = np.flatnonzero((event_class == _CUDA_BACKTRACE) & (corr >= 0))
        if len(backtraces):
            calls = np.flatnonzero(event_class != _CUDA_BACKTRACE)
            keys, _ = group_codes(ints(t, "globalTid"), corr)
            call = lookup(keys[backtraces], keys[calls], calls)
            repeats, call = backtraces[call >= 0], call[call >= 0]
            callchain[call] = np.where(callchain[call] < 0, callchain[repeats], callchain[call])
            keep = np.setdiff1d(np.arange(rows.num_rows), repeats)
            self.skipped["CUDA backtrace records repeating an API call (callchainId kept in its args)"] += len(repeats)
            rows, callchain = rows.take(keep), callchain[keep]
        fields = {}
        if "eventClass" in t.column_names:
            target = self.db.reference(RUNTIME, "eventClass")
            fields["eventClass"] = json_labels(*self.db.labels(target, rows.mapped["eventClass"]))
        if "callchainId" in t.column_names:
            fields["callchainId"] = json_values(pa.array(callchain, mask=callchain < 0))
        return rows, fields

    def _synchronization(self, runtime: Part) -> Part:
        """Synchronization records, on the thread of their API call (the record names only the process)."""
        rows = self.db.rows(SYNCHRONIZATION, ("start", "end", "globalPid", "correlationId", "syncType"),
                            ("start", "end", "correlationId"))
        pid, _ = global_ids(rows.mapped, "globalPid")
        corr = ints(rows.mapped, "correlationId")
        calls = runtime.corr >= 0
        tid = lookup(pid_key(pid, corr), pid_key(runtime.pid[calls], runtime.corr[calls]), runtime.tid[calls])
        keep = np.flatnonzero((corr >= 0) & (tid >= 0))
        if len(keep) < rows.num_rows:
            self.skipped["synchronization records whose API call is not in the export"] += rows.num_rows - len(keep)
            rows, pid, tid = rows.take(keep), pid[keep], tid[keep]
        t, n = rows.mapped, rows.num_rows
        if "syncType" in t.column_names:
            name = dict_array(*self.db.labels(self.db.reference(SYNCHRONIZATION, "syncType"), t["syncType"]))
        else:
            name = dict_array(np.zeros(n, np.int32), ["synchronization"])
        args = self.db.args(rows, {"source": json_labels(np.zeros(n, np.int32), [SYNCHRONIZATION])})
        return Part("other", ints(t, "start"), ints(t, "end"), name, pid, tid, np.full(n, -1),
                    ints(t, "correlationId"), args)

    def _nvtx(self) -> list[Part]:
        """NVTX push/pop ranges, start/end ranges and marks; other records (domain definitions...) are counted."""
        rows = self.db.rows(NVTX, ("start", "end", "eventType", "text", "textId", "globalTid", "globalPid",
                                  "domainId"), ("start", "eventType"))
        t = rows.mapped
        type_names = self.db.enum("ENUM_NSYS_EVENT_TYPE")
        codes, values = factorize(ints(t, "eventType"))
        labels = [type_names.get(int(v), f"type {v}") for v in values]
        type_name = np.array(labels)[codes]
        has_end = (t["end"].is_valid().to_numpy(zero_copy_only=False) if "end" in t.column_names
                   else np.zeros(t.num_rows, bool))
        push_pop, start_end = np.isin(type_name, _PUSH_POP), np.isin(type_name, _START_END)
        mark = np.isin(type_name, _MARKS)
        self.skipped["NVTX ranges without an end"] += int(((push_pop | start_end) & ~has_end).sum())
        for other in np.unique(type_name[~(push_pop | start_end | mark)]).tolist():
            reason = ("NVTX domain definitions (names in args domain)" if other == "NvtxDomainCreate"
                      else f"NVTX {other} records")
            self.skipped[reason] += int((type_name == other).sum())
        text = self._nvtx_text(t)
        created = type_name == "NvtxDomainCreate"
        domains = (ints(t, "domainId")[created], text.filter(pa.array(created)).to_pylist())
        parts = []
        for selected, lane, encloses, instant in ((push_pop & has_end, 0, True, False),
                                                  (start_end & has_end, 1, False, False), (mark, 0, False, True)):
            keep = np.flatnonzero(selected)
            event_type = json_labels(codes[keep], labels)
            parts.append(self._nvtx_part(rows.take(keep), text.take(keep), event_type, domains, lane, encloses,
                                         instant))
        return parts

    def _nvtx_text(self, t: pa.Table) -> pa.Array:
        """Each record's text: its own `text`, else the registered string of its `textId`."""
        text = combine(t["text"]) if "text" in t.column_names else pa.nulls(t.num_rows, pa.string())
        if "textId" in t.column_names and t["textId"].null_count < t.num_rows:
            text = pc.coalesce(text, dict_array(*self.db.strings(t["textId"])).dictionary_decode())
        return text.fill_null("")

    def _nvtx_part(self, rows: Rows, text: pa.Array, event_type: pa.Array, domains: tuple[np.ndarray, list[str]],
                   lane: int, encloses: bool, instant: bool) -> Part:
        t, n = rows.mapped, rows.num_rows
        parsed = pc.extract_regex(text, _EMIT_NVTX)
        first: dict[str, pa.Array] = {"eventType": event_type}
        if len(domains[0]):
            codes = lookup(ints(t, "domainId"), domains[0], np.arange(len(domains[0]), dtype=np.int32))
            first["domain"] = json_labels(codes, domains[1])
        first["seq"] = _blank_to_null(parsed.field("seq"))
        first["op_id"] = _blank_to_null(parsed.field("op_id"))
        first["input_op_ids"] = json_values(_blank_to_null(parsed.field("input_op_ids")))
        if "domainId" in t.column_names:
            first["domainId"] = json_values(t["domainId"])
        pid, tid = thread_ids(t)
        start = ints(t, "start")
        name = parsed.field("name").dictionary_encode()
        return Part("annotation", start, start if instant else ints(t, "end"), name, pid, tid, np.full(n, -1),
                    np.full(n, -1), self.db.args(rows, first), shapes=_blank_to_null(parsed.field("sizes")),
                    lane=np.full(n, lane), encloses=encloses)


# -- helpers ----------------------------------------------------------------------------------------

def _launch_configuration(values: dict[str, Any]) -> dict[str, Any]:
    """Kernel args: the launch configuration under Kineto's names (grid, block, registers per thread,
    shared memory = static + dynamic) first, then the other columns under nsys's names."""
    first: dict[str, Any] = {}
    for dims in ("grid", "block"):
        xyz = [values.get(f"{dims}{axis}") for axis in "XYZ"]
        if None not in xyz:
            first[dims] = xyz
            for axis in "XYZ":
                del values[f"{dims}{axis}"]
    if values.get("registersPerThread") is not None:
        first["registers per thread"] = values.pop("registersPerThread")
    shared = (values.get("staticSharedMemory"), values.get("dynamicSharedMemory"))
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in shared):  # else only as written
        first["shared memory"] = shared[0] + shared[1]
    return {**first, **values}


def pid_key(pid: np.ndarray, corr: np.ndarray) -> np.ndarray:
    """One int64 per (pid, correlation id): CUPTI correlation ids are 32-bit and counted per process."""
    return (pid.astype(np.int64) << 32) | (corr.astype(np.int64) & 0xFFFFFFFF)


def _blank_to_null(values: pa.Array) -> pa.Array:
    return pc.if_else(pc.equal(values, ""), pa.scalar(None, pa.string()), values)
