"""Reader for Nsight Systems SQLite exports (`nsys export --type sqlite`) into a `Trace`.

Table by table (each table's rows in `nsys_parts`, SQLite access in `nsys_tables`, metadata in `nsys_meta`):

| source table                              | goes to                                                                 |
|-------------------------------------------|-------------------------------------------------------------------------|
| `CUPTI_ACTIVITY_KIND_KERNEL` (required)   | `kernel` on `cuda:D/stream S`, demangled name; grid, block, registers,  |
|                                           | shared memory and every other column (short/mangled name...) in args    |
| `CUPTI_ACTIVITY_KIND_MEMCPY` / `_MEMSET`  | `memcpy` / `memset` on the stream, `bytes`; copy and memory kinds       |
|                                           | (ENUM labels) in args; named `[CUDA memcpy Host-to-Device]` as nsys does|
| `CUPTI_ACTIVITY_KIND_RUNTIME`             | `runtime` on the calling thread, `_vNNNN` version cut from the name     |
|                                           | (the full symbol stays in args); CUDA backtrace records (nsys 2022),    |
|                                           | which repeat a call for its stack, fold into it (callchainId in args)   |
| `NVTX_EVENTS` push/pop, start/end ranges  | `annotation` on the thread (start/end ranges, which need not nest, on   |
| and marks                                 | `<thread>/nvtx start-end`); marks as instants; domain names in args     |
| `OSRT_API`, `CUBLAS_EVENTS`,              | `other` on the calling thread, `source` table in args: `runtime` is     |
| `CUDNN_EVENTS`                            | kept for the CUDA launch/sync API, so launch-overhead sums stay CUDA's  |
| `CUPTI_ACTIVITY_KIND_OVERHEAD`            | `other` on the thread (e.g. "Command Buffer Full" inside a launch)      |
| `CUPTI_ACTIVITY_KIND_SYNCHRONIZATION`     | `other` on the thread of the API call it belongs to (by correlation id) |
| `CUDA_GPU_MEMORY_USAGE_EVENTS`            | `memory`: +bytes alloc, −bytes free, running total per device (pinned   |
|                                           | and pageable host memory on `cpu`), `event` = the NVTX range around the |
|                                           | API call; memory kind, pc and pool sizes have no column and are dropped |
| metadata tables (`META_DATA_EXPORT` or    | `metadata`: nsys and schema versions, export time, capture settings,    |
| `EXPORT_META_DATA`, `TARGET_INFO_*`...)   | system, GPUs, session start, process and thread names (see `nsys_meta`) |
| any other table with rows                 | not read: listed with its row count in `reader["unread_tables"]`        |

Times are integer ns from the earliest start in the tables read (`metadata["origin_ns"]` is that
start on nsys's clock). Thread ids are decoded from nsys's serialized `globalTid` (pid = bits 24-47,
tid = bits 0-23); device work has the owning process's pid (its `globalPid`, or the pid bits of a
`globalTid` where an export has that instead) and its stream as `tid`. Correlation ids are counted per
process, so `corr` links rows with the same `pid` only. `cuda:D` is the `deviceId` nsys recorded, the
CUDA device id as the process saw it.

`launcher` of device work is the innermost NVTX push/pop range (such as a PyTorch `aten::mm`)
enclosing its launching runtime call on that thread, -1 if none; the runtime call stays reachable
through (`pid`, `corr`). NVTX texts in the format of `torch.autograd.profiler.emit_nvtx`
(`aten::mm, seq = 3, op_id = 7, sizes = [[2, 3], [3, 4]], input_op_ids = [...]`) are split:
the op name becomes the event name, the sizes go to `shapes`, seq/op_id/input_op_ids to args.

Nothing is dropped silently; `metadata["reader"]["skipped"]` counts rows left out because their start
or end is not an integer within ±2**62 ns, spans ending before they start (kept, duration 0), NVTX
ranges without an end, NVTX records that are no range or mark, synchronization records without their
API call, CUDA backtrace records folded into their call, names whose StringIds entry is missing, and,
per `table.column`, values of the wrong type: a REAL (1.5, ±inf, 1e300), text (`'3x'`) or BLOB in an
INTEGER or id column, text or inf in a REAL one, read as null (columns that only go to args keep them as
written, but inf; see `nsys_tables`); those values are also summed up in one line of
`metadata["reader"]["warnings"]`, which `workbench import` prints.
Text that is not valid UTF-8 (or a BLOB where text belongs) is decoded with U+FFFD for the invalid
bytes. Tables nsys did not create (it creates them lazily) are read as empty; columns that a schema
version lacks are left out of args. `StringIds` and `ENUM_*` references in args columns are resolved
to their text, as the export's own schema comments declare them (or as current nsys does, for old
exports without those comments and tables).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from workbench.errors import TraceFormatError
from workbench.trace import schema
from workbench.trace.columns import dict_array, factorize, lookup
from workbench.trace.model import Trace
from workbench.trace.nesting import innermost_enclosing, nest_spans
from workbench.trace.nsys.meta import reader_report, trace_metadata
from workbench.trace.nsys.parts import LANES, Part, TableParts, pid_key
from workbench.trace.nsys.tables import KERNELS, MEMORY, NsysExport, ints, open_export, process_ids
from workbench.trace.schema import KIND_CODES

_HOST_MEMORY = ("Pageable", "Pinned")


def read_nsys(path: str | os.PathLike[str]) -> Trace:
    """Read an Nsight Systems SQLite export into a `Trace` (see the module docstring)."""
    path = Path(path)
    if not path.exists():
        raise TraceFormatError(path, "no such file")
    if path.is_dir():
        raise TraceFormatError(path, "is a folder, not a trace file")
    if not path.stat().st_size:
        raise TraceFormatError(path, "empty file, not an Nsight Systems SQLite export")
    with open_export(path) as db:
        return _Reader(path, db).trace()


class _Reader:
    """Turns the tables of one export into the Trace tables and metadata."""

    def __init__(self, path: Path, export: NsysExport) -> None:
        self.path = path
        self.db = export
        self.skipped: Counter[str] = Counter()
        self.unlinked = 0

    def trace(self) -> Trace:
        db = self.db
        if not db.has("StringIds", "id", "value"):
            raise TraceFormatError(self.path, "an SQLite database without a StringIds (id, value) table: "
                                              "not an Nsight Systems SQLite export")
        if not db.has(KERNELS):
            raise TraceFormatError(self.path, f"no {KERNELS} table: was the capture run with -t cuda?")
        parts = TableParts(db, self.skipped).read()
        memory = db.read(MEMORY, ("start", "deviceId", "bytes"))
        starts = [int(p.start.min()) for p in parts if len(p)]
        if memory.num_rows:
            starts.append(pc.min(memory["start"]).as_py())
        origin = min(starts) if starts else 0
        events, links = self._events(parts, origin)
        memory = self._memory(memory, origin, links)
        devices = sorted({int(d) for p in parts for d in np.unique(p.device) if d >= 0})
        metadata = trace_metadata(db, origin, events, devices)
        for table, n in db.dropped.items():
            self.skipped[f"{table} rows whose start or end is not an integer within ±2**62 ns (left out)"] += n
        self.skipped.update(db.coerced)
        if db.missing_strings:
            self.skipped["names whose StringIds entry is missing (named StringIds#<id>)"] += db.missing_strings
        metadata["reader"] = reader_report(db, events, memory, self.skipped, self.unlinked)
        return Trace(events=events, memory=memory, metadata=metadata)

    # -- assembly -----------------------------------------------------------------------------------

    def _events(self, parts: list[Part], origin: int) -> tuple[pa.Table, _Links]:
        def cat(attr: str, missing: Any) -> np.ndarray:
            return np.concatenate([np.full(len(p), missing) if getattr(p, attr) is None else getattr(p, attr)
                                   for p in parts])

        start = cat("start", 0) - origin
        dur = cat("end", 0) - origin - start
        if (dur < 0).any():
            self.skipped["spans ending before they start (duration set to 0)"] += int((dur < 0).sum())
            dur = np.maximum(dur, 0)
        kind = np.concatenate([np.full(len(p), KIND_CODES[p.kind], np.int8) for p in parts])
        device, pid, tid, corr = cat("device", -1), cat("pid", -1), cat("tid", -1), cat("corr", -1)
        device_ids = np.unique(device[device >= 0])
        device_code = np.where(device >= 0, np.searchsorted(device_ids, device) + 1, 0)
        track, labels = _tracks(device, tid, pid, cat("lane", 0))
        parent, depth = nest_spans(track, start, dur)
        ranges = np.concatenate([np.full(len(p), p.encloses) for p in parts])
        links = _Links(kind, track, start, dur, parent, pid, corr, ranges)
        launched = np.flatnonzero(np.isin(kind, [KIND_CODES[k] for k in schema.DEVICE_KINDS]) & (corr >= 0))
        launcher = np.full(len(start), -1, dtype=np.int64)
        launcher[launched] = links.enclosing(pid[launched], corr[launched])
        self.unlinked = int((links.call(pid[launched], corr[launched]) < 0).sum())
        names = pa.chunked_array([p.name.cast(schema.EVENTS.field("name").type) for p in parts]).unify_dictionaries()
        table = pa.table(
            {
                "start_ns": start,
                "dur_ns": dur,
                "name": names.combine_chunks(),
                "kind": dict_array(kind, list(schema.KINDS)),
                "device": dict_array(device_code, ["cpu", *(f"cuda:{d}" for d in device_ids)]),
                "track": dict_array(track, labels),
                "pid": pid,
                "tid": tid,
                "corr": corr,
                "parent": parent,
                "depth": depth,
                "launcher": launcher,
                "flops": np.full(len(start), np.nan),
                "bytes": cat("bytes", np.nan),
                "shapes": pa.concat_arrays([pa.nulls(len(p), pa.string()) if p.shapes is None else p.shapes
                                            for p in parts]),
                "dtypes": pa.nulls(len(start), pa.string()),
                "args": pa.concat_arrays([p.args for p in parts]),
            },
            schema=schema.EVENTS,
        )
        return table, links

    def _memory(self, t: pa.Table, origin: int, links: _Links) -> pa.Table:
        """GPU memory (de)allocations, a running total per device, each tied to the NVTX range of its call."""
        if not t.num_rows:
            return schema.MEMORY.empty_table()
        t = t.take(np.argsort(ints(t, "start"), kind="stable"))
        size = ints(t, "bytes")
        freed = np.zeros(t.num_rows, bool)
        if "memoryOperationType" in t.column_names:
            codes, labels = self.db.labels(self.db.reference(MEMORY, "memoryOperationType"), t["memoryOperationType"])
            freed = np.array(["dealloc" in s.lower() for s in labels] + [False])[codes]
        device = ints(t, "deviceId")
        if "memKind" in t.column_names:
            codes, labels = self.db.labels(self.db.reference(MEMORY, "memKind"), t["memKind"])
            device = np.where(np.array([s in _HOST_MEMORY for s in labels] + [False])[codes], -1, device)
        delta = np.where(freed, -size, size)
        device_ids, device_code = np.unique(device, return_inverse=True)
        allocated = np.empty_like(delta)
        for code in range(len(device_ids)):
            rows = np.flatnonzero(device_code == code)
            allocated[rows] = np.cumsum(delta[rows])
        pid = process_ids(t)
        return pa.table(
            {
                "ts_ns": ints(t, "start") - origin,
                "device": dict_array(device_code, ["cpu" if d < 0 else f"cuda:{d}" for d in device_ids.tolist()]),
                "addr": ints(t, "address"),
                "delta_bytes": delta,
                "allocated_bytes": allocated,
                "reserved_bytes": np.full(t.num_rows, -1),
                "event": links.enclosing(pid, ints(t, "correlationId")),
            },
            schema=schema.MEMORY,
        )


class _Links:
    """Runtime calls by (pid, correlation id), and the innermost NVTX push/pop range enclosing each."""

    def __init__(self, kind: np.ndarray, track: np.ndarray, start: np.ndarray, dur: np.ndarray, parent: np.ndarray,
                 pid: np.ndarray, corr: np.ndarray, ranges: np.ndarray) -> None:
        self.calls = np.flatnonzero((kind == KIND_CODES["runtime"]) & (corr >= 0))
        self.keys = pid_key(pid[self.calls], corr[self.calls])
        self.ranges = innermost_enclosing(track[self.calls], start[self.calls], track, start, dur, parent, ranges)

    def call(self, pid: np.ndarray, corr: np.ndarray) -> np.ndarray:
        """Row of the runtime call with each (pid, corr), -1 if none."""
        return np.where(corr >= 0, lookup(pid_key(pid, corr), self.keys, self.calls), -1)

    def enclosing(self, pid: np.ndarray, corr: np.ndarray) -> np.ndarray:
        """Row of the NVTX range enclosing the runtime call with each (pid, corr), -1 if none."""
        return np.where(corr >= 0, lookup(pid_key(pid, corr), self.keys, self.ranges), -1)


# -- helpers ----------------------------------------------------------------------------------------

def _tracks(device: np.ndarray, tid: np.ndarray, pid: np.ndarray, lane: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Track code per row and the labels: `cuda:D/stream S` (`cuda:D/pid P/stream S` where processes share a
    stream id on a device), `cpu/thread T` (`cpu/pid P/thread T` when several processes have host rows)."""
    if not len(device):
        return np.zeros(0, dtype=np.int64), []
    columns = [factorize(c) for c in (device, tid, pid, lane)]
    combined = np.zeros(len(device), dtype=np.int64)
    for codes, values in columns:
        combined = combined * len(values) + codes
    unique, track = np.unique(combined, return_inverse=True)
    rows = []
    for key in unique.tolist():
        row = []
        for _, values in reversed(columns):
            key, code = divmod(key, len(values))
            row.append(int(values[code]))
        rows.append(row[::-1])
    host_pids = {p for d, _, p, _ in rows if d < 0}
    processes_per_stream = Counter((d, t) for d, t, _, _ in rows if d >= 0)
    labels = []
    for d, t, p, lane_index in rows:
        if d >= 0:
            labels.append(f"cuda:{d}/pid {p}/stream {t}" if processes_per_stream[d, t] > 1 else f"cuda:{d}/stream {t}")
        else:
            thread = f"cpu/pid {p}/thread {t}" if len(host_pids) > 1 else f"cpu/thread {t}"
            labels.append(thread + LANES[lane_index])
    return track.astype(np.int64), labels
