"""Reader for Nsight Systems SQLite exports (`nsys export --type sqlite`) into a `Trace`.

Table by table:

| source table                              | goes to                                                                 |
|-------------------------------------------|-------------------------------------------------------------------------|
| `CUPTI_ACTIVITY_KIND_KERNEL` (required)   | `kernel` on `cuda:D/stream S`, demangled name; grid, block, registers,  |
|                                           | shared memory and every other column (short/mangled name...) in args    |
| `CUPTI_ACTIVITY_KIND_MEMCPY` / `_MEMSET`  | `memcpy` / `memset` on the stream, `bytes`; copy and memory kinds       |
|                                           | (ENUM labels) in args; named `[CUDA memcpy Host-to-Device]` as nsys does|
| `CUPTI_ACTIVITY_KIND_RUNTIME`             | `runtime` on the calling thread, `_vNNNN` version cut from the name     |
|                                           | (the full symbol stays in args)                                         |
| `NVTX_EVENTS` push/pop, start/end ranges  | `annotation` on the thread (start/end ranges, which need not nest, on   |
| and marks                                 | `<thread>/nvtx start-end`); marks as instants; domain names in args     |
| `OSRT_API`, `CUBLAS_EVENTS`,              | `other` on the calling thread, `source` table in args: `runtime` is     |
| `CUDNN_EVENTS`                            | kept for the CUDA launch/sync API, so launch-overhead sums stay CUDA's  |
| `CUPTI_ACTIVITY_KIND_OVERHEAD`            | `other` on the thread (e.g. "Command Buffer Full" inside a launch)      |
| `CUPTI_ACTIVITY_KIND_SYNCHRONIZATION`     | `other` on the thread of the API call it belongs to (by correlation id) |
| `CUDA_GPU_MEMORY_USAGE_EVENTS`            | `memory`: +bytes alloc, −bytes free, running total per device (pinned   |
|                                           | and pageable host memory on `cpu`), `event` = the NVTX range around the |
|                                           | API call; memory kind, pc and pool sizes have no column and are dropped |
| `TARGET_INFO_GPU`                         | `metadata["devices"]` (every device with activity is listed)            |
| `META_DATA_EXPORT`, `META_DATA_CAPTURE`,  | `metadata`: schema and nsys versions, capture settings, system, session |
| `TARGET_INFO_SYSTEM_ENV`, `PROCESSES`,    | start, process and thread names (environment variables are left out:    |
| `ThreadNames`, `TARGET_INFO_SESSION_...`  | they can hold secrets)                                                  |
| any other table with rows                 | not read: listed with its row count in `reader["unread_tables"]`        |

Times are integer ns from the earliest start in the tables read (`metadata["origin_ns"]` is that
start on nsys's clock). Thread ids are decoded from nsys's serialized `globalTid` (pid = bits 24-47,
tid = bits 0-23); device work has the owning process's pid and its stream as `tid`. Correlation
ids are counted per process, so `corr` links rows with the same `pid` only. `cuda:D` is the
`deviceId` nsys recorded, the CUDA device id as the process saw it.

`launcher` of device work is the innermost NVTX push/pop range (such as a PyTorch `aten::mm`)
enclosing its launching runtime call on that thread, -1 if none; the runtime call stays reachable
through (`pid`, `corr`). NVTX texts in the format of `torch.autograd.profiler.emit_nvtx`
(`aten::mm, seq = 3, op_id = 7, sizes = [[2, 3], [3, 4]], input_op_ids = [...]`) are split:
the op name becomes the event name, the sizes go to `shapes`, seq/op_id/input_op_ids to args.

Tables nsys did not create (it creates them lazily) are read as empty; columns that a schema
version lacks are left out of args. `StringIds` and `ENUM_*` references in args columns are
resolved to their text, as the export's own schema comments declare them.
"""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from workbench.errors import TraceFormatError, WorkbenchError
from workbench.trace import schema
from workbench.trace.columns import dict_array, factorize, grouped, json_labels, json_objects, json_values, lookup
from workbench.trace.model import Trace
from workbench.trace.nesting import innermost_enclosing, nest_spans

KIND_CODES = {k: i for i, k in enumerate(schema.KINDS)}

KERNELS = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
SYNCHRONIZATION = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
NVTX = "NVTX_EVENTS"
MEMORY = "CUDA_GPU_MEMORY_USAGE_EVENTS"

_HOST_CALLS = (  # (table, kind): API calls on a host thread, named through nameId
    (RUNTIME, "runtime"),
    ("OSRT_API", "other"),
    ("CUBLAS_EVENTS", "other"),
    ("CUDNN_EVENTS", "other"),
    ("CUPTI_ACTIVITY_KIND_OVERHEAD", "other"),
)
_DEVICE_COLUMNS = ("start", "end", "deviceId", "streamId", "correlationId", "globalPid")
_LAUNCH_CONFIGURATION = ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread",
                         "staticSharedMemory", "dynamicSharedMemory")
_HOST_MEMORY = ("Pageable", "Pinned")
_SECRET_PRONE = re.compile(r"ENV", re.IGNORECASE)  # environment variables in capture/system records
_FETCH_ROWS = 65536
_SAMPLE_ROWS = 4096
_IN_BATCH = 900  # ids per `IN (...)` (SQLite's historic limit on bound parameters is 999)
_REFERENCE = re.compile(r"REFERENCES\s+(StringIds|ENUM_\w+)\s*\(\s*id\s*\)")
_DEFAULT_REFERENCES = {  # for exports (or hand-made databases) whose schema carries no comments
    KERNELS: {"shortName": "StringIds", "mangledName": "StringIds"},
    MEMCPY: {"copyKind": "ENUM_CUDA_MEMCPY_OPER", "srcKind": "ENUM_CUDA_MEM_KIND", "dstKind": "ENUM_CUDA_MEM_KIND"},
    MEMSET: {"memKind": "ENUM_CUDA_MEM_KIND"},
    SYNCHRONIZATION: {"syncType": "ENUM_CUPTI_SYNC_TYPE"},
    "CUPTI_ACTIVITY_KIND_OVERHEAD": {"overheadType": "ENUM_CUPTI_OVERHEAD_TYPE"},
    NVTX: {"eventType": "ENUM_NSYS_EVENT_TYPE", "jsonTextId": "StringIds"},
    MEMORY: {"memKind": "ENUM_CUDA_MEM_KIND", "memoryOperationType": "ENUM_CUDA_DEV_MEM_EVENT_OPER"},
}
_NVTX_TYPES = {34: "NvtxMark", 59: "NvtxPushPopRange", 60: "NvtxStartEndRange", 65: "NvtxtMark",
               70: "NvtxtPushPopRange", 71: "NvtxtStartEndRange", 75: "NvtxDomainCreate"}
"""ENUM_NSYS_EVENT_TYPE ids of the NVTX records read, for exports without that table."""
_PUSH_POP = ("NvtxPushPopRange", "NvtxtPushPopRange")
_START_END = ("NvtxStartEndRange", "NvtxtStartEndRange")
_MARKS = ("NvtxMark", "NvtxtMark")
_EMIT_NVTX = (r"(?s)^(?P<name>.*?)(?:, seq = (?P<seq>-?\d+))?(?:, op_id = (?P<op_id>\d+))?"
              r"(?:, sizes = (?P<sizes>\[.*?\]))?(?:, input_op_ids = (?P<input_op_ids>\[.*\]))?$")
_API_VERSION = re.compile(r"_v\d+$")
_LANES = ("", "/nvtx start-end")


def read_nsys(path: str | os.PathLike[str]) -> Trace:
    """Read an Nsight Systems SQLite export into a `Trace` (see the module docstring)."""
    path = Path(path)
    if not path.exists():
        raise TraceFormatError(path, "no such file")
    if path.is_dir():
        raise TraceFormatError(path, "is a folder, not a trace file")
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise TraceFormatError(path, f"cannot open as SQLite: {exc}") from exc
    try:
        return _Reader(path, _Export(path, con)).trace()
    except sqlite3.DatabaseError as exc:
        if "not a database" in str(exc):
            raise TraceFormatError(path, "not an SQLite database") from exc
        raise TraceFormatError(path, f"corrupt or truncated SQLite database ({exc})") from exc
    finally:
        con.close()


@dataclass
class _Rows:
    """Rows of an event table: the columns the reader maps, and the others on their way to args.

    The others travel from SQLite as one JSON array per row (`grouped`, dictionary-encoded: most
    rows repeat a few combinations), except those with many distinct values (`single`).
    """

    table: str
    mapped: pa.Table
    grouped: pa.DictionaryArray
    grouped_columns: list[str]
    single: pa.Table

    @property
    def num_rows(self) -> int:
        return self.mapped.num_rows

    def take(self, rows: np.ndarray) -> _Rows:
        index = pa.array(rows, pa.int64())
        return _Rows(self.table, self.mapped.take(index), self.grouped.take(index), self.grouped_columns,
                     self.single.take(index))


class _Export:
    """Read access to one export: its tables as Arrow, and the StringIds and ENUM lookups."""

    def __init__(self, path: Path, con: sqlite3.Connection) -> None:
        self.path = path
        self.con = con
        self.columns: dict[str, dict[str, pa.DataType | None]] = {}
        self.references: dict[str, dict[str, str]] = {}
        for name, sql in con.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall():
            info = con.execute(f"PRAGMA table_info({_quote(name)})").fetchall()
            self.columns[name] = {row[1]: _arrow_type(row[2]) for row in info}
            self.references[name] = {**_DEFAULT_REFERENCES.get(name, {}), **_references(sql or "")}
        try:
            con.execute("SELECT json_array(1)")
        except sqlite3.OperationalError as exc:
            raise WorkbenchError(f"the SQLite library of this Python ({sqlite3.sqlite_version}) lacks the JSON "
                                 "functions the nsys reader needs (built in since SQLite 3.38)") from exc
        self.rows_read: dict[str, int] = {}
        self.missing_strings = 0
        self._strings: dict[int, str] = {}
        self._enums: dict[str, dict[int, str]] = {}

    def has(self, table: str) -> bool:
        return table in self.columns

    def count(self, table: str) -> int:
        return self.con.execute(f"SELECT COUNT(*) FROM {_quote(table)}").fetchone()[0]

    def reference(self, table: str, column: str) -> str:
        """The StringIds or ENUM_* table a column refers to (empty if none is known)."""
        return self.references.get(table, {}).get(column, "")

    def read(self, table: str, required: tuple[str, ...] = ()) -> pa.Table:
        """All columns of `table`, typed as declared (an absent table is empty); NULL is null."""
        columns = self._columns(table, required)
        return self._fetch(table, [_value_sql(c, t) for c, t in columns.items()], columns)

    def rows(self, table: str, mapped: tuple[str, ...], required: tuple[str, ...] = (),
             grouped: tuple[str, ...] = ()) -> _Rows:
        """The `mapped` columns (those the table has) and the others for args (`grouped` always travel
        grouped; see `_Rows`)."""
        columns = self._columns(table, required)
        own = {c: t for c, t in columns.items() if c in mapped}
        others = [c for c in columns if c not in mapped]
        varied = self._varied(table, [c for c in others if c not in grouped])
        single = {c: columns[c] for c in others if c in varied}
        together = [c for c in others if c not in varied]
        selects = [_value_sql(c, t) for c, t in {**own, **single}.items()]
        types = {**own, **single}
        if together:
            selects.append(f"json_array({', '.join(_value_sql(c, columns[c]) for c in together)})")
            types["json_array"] = pa.string()
        t = self._fetch(table, selects, types)
        grouped_array = (t["json_array"].combine_chunks().dictionary_encode() if together
                         else dict_array(np.zeros(t.num_rows, np.int32), ["[]"]))
        return _Rows(table, t.select(list(own)), grouped_array, together, t.select(list(single)))

    def _columns(self, table: str, required: tuple[str, ...]) -> dict[str, pa.DataType | None]:
        """The declared columns; an absent table (nsys creates them lazily) has just the required ones."""
        if table not in self.columns:
            return {c: pa.int64() for c in required}
        missing = [c for c in required if c not in self.columns[table]]
        if missing:
            raise TraceFormatError(self.path, f"table {table} has no column {', '.join(missing)}")
        return self.columns[table]

    def _varied(self, table: str, columns: list[str]) -> set[str]:
        """The columns with many distinct values among the first rows: fetched one by one, not grouped."""
        if not columns or table not in self.columns:
            return set()
        counts = ", ".join(f"count(DISTINCT {_quote(c)})" for c in columns)
        sample = f"SELECT {', '.join(map(_quote, columns))} FROM {_quote(table)} LIMIT {_SAMPLE_ROWS}"
        rows, *distinct = self.con.execute(f"SELECT count(*), {counts} FROM ({sample})").fetchone()
        return {c for c, n in zip(columns, distinct, strict=True) if n > max(16, rows // 16)}

    def _fetch(self, table: str, selects: list[str], types: dict[str, pa.DataType | None]) -> pa.Table:
        """Run one SELECT over `table` in chunks into Arrow columns named and typed by `types`."""
        chunks: list[list[pa.Array]] = []
        if table in self.columns:
            cursor = self.con.execute(f"SELECT {', '.join(selects)} FROM {_quote(table)}")
            while rows := cursor.fetchmany(_FETCH_ROWS):
                values = zip(*rows, strict=True)
                try:
                    chunks.append([pa.array(v, type=t) for v, t in zip(values, types.values(), strict=True)])
                except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                    raise TraceFormatError(self.path, f"table {table} holds values of unexpected type ({exc})") from exc
            self.rows_read[table] = sum(len(chunk[0]) for chunk in chunks)
        arrays = {}
        for i, (name, dtype) in enumerate(types.items()):
            parts = [chunk[i] for chunk in chunks]
            arrays[name] = pa.chunked_array(parts, type=dtype or (parts[0].type if parts else pa.int64()))
        return pa.table(arrays)

    def strings(self, ids: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[str]]:
        """(codes, texts) of StringIds references; code -1 where the id is null."""
        encoded = _combine(ids).cast(pa.int64()).dictionary_encode()
        ids = encoded.dictionary.to_pylist()
        texts = self._texts(ids)
        return encoded.indices.fill_null(-1).to_numpy().astype(np.int32), [texts[i] for i in ids]

    def _texts(self, ids: list[int]) -> dict[int, str]:
        """StringIds values by id, fetched once; an id without an entry reads `StringIds#<id>` (counted)."""
        todo = [i for i in set(ids) if i not in self._strings]
        if todo and self.has("StringIds"):
            for at in range(0, len(todo), _IN_BATCH):
                batch = todo[at:at + _IN_BATCH]
                sql = f"SELECT id, value FROM StringIds WHERE id IN ({', '.join('?' * len(batch))})"
                self._strings.update(self.con.execute(sql, batch).fetchall())
        for i in todo:
            if i not in self._strings:
                self.missing_strings += 1
                self._strings[i] = f"StringIds#{i}"
        return {i: self._strings[i] for i in ids}

    def enum(self, table: str) -> dict[int, str]:
        """Labels (or names) of an ENUM_* table by id; empty where the export lacks it."""
        if table not in self._enums:
            columns = self.columns.get(table, {})
            text = "label" if "label" in columns else "name"
            ok = "id" in columns and text in columns
            rows = self.con.execute(f"SELECT id, {text} FROM {_quote(table)}").fetchall() if ok else []
            self._enums[table] = {int(i): str(v) for i, v in rows if i is not None}
        return self._enums[table]

    def labels(self, table: str, ids: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[str]]:
        """(codes, labels) of ENUM references, code -1 where the id is null; an id the ENUM table
        lacks is labelled by its number."""
        encoded = _combine(ids).cast(pa.int64()).dictionary_encode()
        names = self.enum(table)
        labels = [names.get(i, str(i)) for i in encoded.dictionary.to_pylist()]
        return encoded.indices.fill_null(-1).to_numpy().astype(np.int32), labels

    def args(self, rows: _Rows, first: dict[str, pa.Array] | None = None,
             shape: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> pa.Array:
        """The args JSON of each row: `first`, the grouped columns (rearranged by `shape`), then the
        single ones; StringIds and ENUM references as their text, nulls left out."""
        combinations = [dict(zip(rows.grouped_columns, json.loads(text), strict=True))
                        for text in rows.grouped.dictionary.to_pylist()]
        for column in rows.grouped_columns:
            target = self.reference(rows.table, column)
            if target:
                ids = [c[column] for c in combinations if isinstance(c[column], int)]
                names = self._texts(ids) if target == "StringIds" else self.enum(target)
                for c in combinations:
                    if isinstance(c[column], int):
                        c[column] = names.get(c[column], str(c[column]))
        texts = [",".join(f"{json.dumps(k)}:{json.dumps(v, ensure_ascii=False, separators=(',', ':'))}"
                          for k, v in (shape(c) if shape else c).items() if v is not None and not _non_finite(v))
                 for c in combinations]
        fields = dict(first or {})
        for column in rows.single.column_names:
            values = rows.single[column]
            target = self.reference(rows.table, column)
            if target == "StringIds":
                fields[column] = json_labels(*self.strings(values))
            elif target:
                fields[column] = json_labels(*self.labels(target, values))
            else:
                fields[column] = json_values(values)
        members = pa.DictionaryArray.from_arrays(rows.grouped.indices, pa.array(texts, pa.string()))
        return json_objects(fields, rows.num_rows, members)


@dataclass
class _Part:
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
    lane: np.ndarray | None = None  # index into _LANES: a sub-lane of the thread's track
    encloses: bool = False  # NVTX push/pop ranges: candidates for a launch's enclosing range

    def __len__(self) -> int:
        return len(self.start)


class _Reader:
    """Turns the tables of one export into the Trace tables and metadata."""

    def __init__(self, path: Path, export: _Export) -> None:
        self.path = path
        self.db = export
        self.skipped: Counter[str] = Counter()
        self.unlinked = 0

    def trace(self) -> Trace:
        db = self.db
        if not db.has("StringIds"):
            raise TraceFormatError(self.path, "an SQLite database without a StringIds table: "
                                              "not an Nsight Systems SQLite export")
        if not db.has(KERNELS):
            raise TraceFormatError(self.path, f"no {KERNELS} table: was the capture run with -t cuda?")
        device_parts = [self._kernels(), self._memcpy(), self._memset()]
        calls = [self._host_calls(table, kind) for table, kind in _HOST_CALLS]
        parts = [*device_parts, *calls, self._synchronization(calls[0]), *self._nvtx()]
        memory = db.read(MEMORY, ("start", "deviceId", "bytes"))
        starts = [int(p.start.min()) for p in parts if len(p)]
        if memory.num_rows:
            starts.append(pc.min(memory["start"]).as_py())
        origin = min(starts) if starts else 0
        events, links = self._events(parts, origin)
        memory = self._memory(memory, origin, links)
        devices = sorted({int(d) for p in device_parts for d in np.unique(p.device)})
        return Trace(events=events, memory=memory, metadata=self._metadata(origin, events, memory, devices))

    # -- device work ------------------------------------------------------------------------------

    def _kernels(self) -> _Part:
        names = ("demangledName", "shortName", "mangledName")
        rows = self.db.rows(KERNELS, (*_DEVICE_COLUMNS, *names), ("start", "end", "deviceId", "streamId"),
                            grouped=_LAUNCH_CONFIGURATION)
        t = rows.mapped
        present = [_combine(t[c]) for c in names if c in t.column_names]
        if not present:
            raise TraceFormatError(self.path, f"table {KERNELS} has no kernel name column (demangledName, shortName)")
        first = {c: json_labels(*self.db.strings(t[c])) for c in names[1:] if c in t.column_names}
        name = dict_array(*self.db.strings(pc.coalesce(*present)))
        return self._device_part("kernel", rows, name, self.db.args(rows, first, _launch_configuration))

    def _memcpy(self) -> _Part:
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
                                 _ints(rows.mapped, "bytes").astype(float))

    def _memset(self) -> _Part:
        rows = self.db.rows(MEMSET, (*_DEVICE_COLUMNS, "bytes"), ("start", "end", "deviceId", "streamId", "bytes"))
        name = dict_array(np.zeros(rows.num_rows, np.int32), ["[CUDA memset]"])
        return self._device_part("memset", rows, name, self.db.args(rows), _ints(rows.mapped, "bytes").astype(float))

    @staticmethod
    def _device_part(kind: str, rows: _Rows, name: pa.Array, args: pa.Array, size: np.ndarray | None = None) -> _Part:
        t = rows.mapped
        pid, _ = _global_ids(t, "globalPid")
        return _Part(kind, _ints(t, "start"), _ints(t, "end"), name, pid, _ints(t, "streamId"),
                     _ints(t, "deviceId"), _ints(t, "correlationId"), args, bytes=size)

    # -- host threads -----------------------------------------------------------------------------

    def _host_calls(self, table: str, kind: str) -> _Part:
        """API calls named through nameId (the overhead table names some by their overheadType only)."""
        rows = self.db.rows(table, ("start", "end", "globalTid", "nameId", "correlationId", "overheadType"),
                            ("start", "end"))
        t, n = rows.mapped, rows.num_rows
        codes, names = self.db.strings(t["nameId"]) if "nameId" in t.column_names else (np.full(n, -1, np.int32), [])
        first: dict[str, pa.Array] = {}
        if table == RUNTIME:
            first["symbol"] = json_labels(codes, names)
            names = [_API_VERSION.sub("", v) for v in names]
        else:
            first["source"] = json_labels(np.zeros(n, np.int32), [table])
        if "overheadType" in t.column_names:
            overhead, labels = self.db.labels(self.db.reference(table, "overheadType"), t["overheadType"])
            first["overheadType"] = json_labels(overhead, labels)
            if (codes < 0).any():
                codes = np.where(codes < 0, overhead + len(names), codes)
                names = names + labels
        pid, tid = _global_ids(t, "globalTid")
        return _Part(kind, _ints(t, "start"), _ints(t, "end"), dict_array(codes, names), pid, tid,
                     np.full(n, -1), _ints(t, "correlationId"), self.db.args(rows, first))

    def _synchronization(self, runtime: _Part) -> _Part:
        """Synchronization records, on the thread of their API call (the record names only the process)."""
        rows = self.db.rows(SYNCHRONIZATION, ("start", "end", "globalPid", "correlationId", "syncType"),
                            ("start", "end", "correlationId"))
        pid, _ = _global_ids(rows.mapped, "globalPid")
        corr = _ints(rows.mapped, "correlationId")
        calls = runtime.corr >= 0
        tid = lookup(_key(pid, corr), _key(runtime.pid[calls], runtime.corr[calls]), runtime.tid[calls])
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
        return _Part("other", _ints(t, "start"), _ints(t, "end"), name, pid, tid, np.full(n, -1),
                     _ints(t, "correlationId"), args)

    def _nvtx(self) -> list[_Part]:
        """NVTX push/pop ranges, start/end ranges and marks; other records (domain definitions...) are counted."""
        rows = self.db.rows(NVTX, ("start", "end", "eventType", "text", "textId", "globalTid", "domainId"),
                            ("start", "eventType"))
        t = rows.mapped
        type_names = {**_NVTX_TYPES, **self.db.enum("ENUM_NSYS_EVENT_TYPE")}
        codes, values = factorize(_ints(t, "eventType"))
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
        domains = (_ints(t, "domainId")[created], text.filter(pa.array(created)).to_pylist())
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
        text = _combine(t["text"]) if "text" in t.column_names else pa.nulls(t.num_rows, pa.string())
        if "textId" in t.column_names and t["textId"].null_count < t.num_rows:
            text = pc.coalesce(text, dict_array(*self.db.strings(t["textId"])).dictionary_decode())
        return text.fill_null("")

    def _nvtx_part(self, rows: _Rows, text: pa.Array, event_type: pa.Array, domains: tuple[np.ndarray, list[str]],
                   lane: int, encloses: bool, instant: bool) -> _Part:
        t, n = rows.mapped, rows.num_rows
        parsed = pc.extract_regex(text, _EMIT_NVTX)
        first: dict[str, pa.Array] = {"eventType": event_type}
        if len(domains[0]):
            codes = lookup(_ints(t, "domainId"), domains[0], np.arange(len(domains[0]), dtype=np.int32))
            first["domain"] = json_labels(codes, domains[1])
        first["seq"] = _blank_to_null(parsed.field("seq"))
        first["op_id"] = _blank_to_null(parsed.field("op_id"))
        first["input_op_ids"] = json_values(_blank_to_null(parsed.field("input_op_ids")))
        if "domainId" in t.column_names:
            first["domainId"] = json_values(t["domainId"])
        pid, tid = _global_ids(t, "globalTid")
        start = _ints(t, "start")
        name = parsed.field("name").dictionary_encode()
        return _Part("annotation", start, start if instant else _ints(t, "end"), name, pid, tid, np.full(n, -1),
                     np.full(n, -1), self.db.args(rows, first), shapes=_blank_to_null(parsed.field("sizes")),
                     lane=np.full(n, lane), encloses=encloses)

    # -- assembly -----------------------------------------------------------------------------------

    def _events(self, parts: list[_Part], origin: int) -> tuple[pa.Table, _Links]:
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
        t = t.take(np.argsort(_ints(t, "start"), kind="stable"))
        size = _ints(t, "bytes")
        freed = np.zeros(t.num_rows, bool)
        if "memoryOperationType" in t.column_names:
            codes, labels = self.db.labels(self.db.reference(MEMORY, "memoryOperationType"), t["memoryOperationType"])
            freed = np.array(["dealloc" in s.lower() or s == "1" for s in labels] + [False])[codes]
        device = _ints(t, "deviceId")
        if "memKind" in t.column_names:
            codes, labels = self.db.labels(self.db.reference(MEMORY, "memKind"), t["memKind"])
            device = np.where(np.array([s in _HOST_MEMORY for s in labels] + [False])[codes], -1, device)
        delta = np.where(freed, -size, size)
        device_ids, device_code = np.unique(device, return_inverse=True)
        allocated = np.empty_like(delta)
        for code in range(len(device_ids)):
            rows = np.flatnonzero(device_code == code)
            allocated[rows] = np.cumsum(delta[rows])
        pid, _ = _global_ids(t, "globalPid")
        return pa.table(
            {
                "ts_ns": _ints(t, "start") - origin,
                "device": dict_array(device_code, ["cpu" if d < 0 else f"cuda:{d}" for d in device_ids.tolist()]),
                "addr": _ints(t, "address"),
                "delta_bytes": delta,
                "allocated_bytes": allocated,
                "reserved_bytes": np.full(t.num_rows, -1),
                "event": links.enclosing(pid, _ints(t, "correlationId")),
            },
            schema=schema.MEMORY,
        )

    # -- metadata -----------------------------------------------------------------------------------

    def _metadata(self, origin: int, events: pa.Table, memory: pa.Table, devices: list[int]) -> dict[str, Any]:
        export = self._pairs("META_DATA_EXPORT")
        system = {k: v for k, v in self._pairs("TARGET_INFO_SYSTEM_ENV").items() if not _SECRET_PRONE.search(k)}
        threads = np.unique(_key(events["pid"].to_numpy(), events["tid"].to_numpy()))
        threads = np.stack([threads >> 32, threads & 0xFFFFFFFF], axis=1)
        metadata = {
            "source": {"format": "nsys", "file": str(self.path), "bytes": self.path.stat().st_size, "export": export},
            "schema_version": export.get("EXPORT_SCHEMA_VERSION"),
            "nsys_version": export.get("EXPORT_PRODUCT_VERSION"),
            "driver_version": system.get("NvDriverVersion"),
            "cuda_driver_version": system.get("CudaDriverVersion"),
            "origin_ns": origin,
            "session": self._first_row("TARGET_INFO_SESSION_START_TIME"),
            "capture": {k: v for k, v in self._pairs("META_DATA_CAPTURE").items() if not _SECRET_PRONE.search(k)},
            "system": system,
            "devices": self._devices(devices),
            "processes": self._processes(set(threads[:, 0].tolist())),
            "threads": self._threads({(p, t) for p, t in threads.tolist()}),
        }
        if self.db.missing_strings:
            self.skipped["names whose StringIds entry is missing (named StringIds#<id>)"] += self.db.missing_strings
        unread = {name: self.db.count(name) for name in sorted(self.db.columns)
                  if name not in self.db.rows_read and name != "StringIds" and not name.startswith("ENUM_")}
        metadata["reader"] = {
            "tables": dict(sorted(self.db.rows_read.items())),
            "unread_tables": {k: v for k, v in unread.items() if v},
            "events": events.num_rows,
            "memory": memory.num_rows,
            "counters": 0,
            "device_work_launched_outside_the_export": self.unlinked,
            "skipped": {k: v for k, v in self.skipped.items() if v},
        }
        return metadata

    def _pairs(self, table: str) -> dict[str, Any]:
        """A name → value table as a dict; a name given more than once keeps all its values, as a list."""
        if not self.db.has(table):
            return {}
        t = self.db.read(table, ("name", "value"))
        return grouped(zip(t["name"].to_pylist(), t["value"].to_pylist(), strict=True))

    def _first_row(self, table: str) -> dict[str, Any]:
        rows = self.db.read(table).to_pylist() if self.db.has(table) else []
        return rows[0] if rows else {}

    def _devices(self, seen: list[int]) -> list[dict[str, Any]]:
        """One entry per CUDA device with activity or listed in TARGET_INFO_GPU (matched on its CUDA id)."""
        gpus: dict[int, dict[str, Any]] = {}
        if self.db.has("TARGET_INFO_GPU"):
            for row in self.db.read("TARGET_INFO_GPU").to_pylist():
                cuda_id = row["cuDevice"] if row.get("cuDevice") is not None else row.get("id")
                if cuda_id is not None:
                    gpus[int(cuda_id)] = row
        devices = []
        for d in sorted(set(seen) | set(gpus)):
            row = gpus.get(d, {})
            major, minor = row.get("computeMajor"), row.get("computeMinor")
            devices.append({
                "device": f"cuda:{d}",
                "name": row.get("name"),
                "memory_bytes": row.get("totalMemory"),
                "memory_bandwidth_bytes_per_s": row.get("memoryBandwidth"),
                "sm_count": row.get("smCount"),
                "clock_hz": row.get("clockRate"),
                "compute_capability": None if major is None else f"{major}.{minor}",
                "source": row,
            })
        return devices

    def _processes(self, pids: set[int]) -> dict[str, dict[str, Any]]:
        if not self.db.has("PROCESSES"):
            return {}
        rows = self.db.read("PROCESSES", ("pid", "name")).to_pylist()
        return {str(r["pid"]): {"name": r["name"]} for r in rows if r["pid"] in pids}

    def _threads(self, threads: set[tuple[int, int]]) -> dict[str, dict[str, Any]]:
        if not self.db.has("ThreadNames"):
            return {}
        t = self.db.read("ThreadNames", ("nameId", "globalTid"))
        pid, tid = _global_ids(t, "globalTid")
        codes, names = self.db.strings(t["nameId"])
        return {f"{p}/{i}": {"name": names[c] if c >= 0 else None}
                for p, i, c in zip(pid.tolist(), tid.tolist(), codes.tolist(), strict=True) if (p, i) in threads}


class _Links:
    """Runtime calls by (pid, correlation id), and the innermost NVTX push/pop range enclosing each."""

    def __init__(self, kind: np.ndarray, track: np.ndarray, start: np.ndarray, dur: np.ndarray, parent: np.ndarray,
                 pid: np.ndarray, corr: np.ndarray, ranges: np.ndarray) -> None:
        self.calls = np.flatnonzero((kind == KIND_CODES["runtime"]) & (corr >= 0))
        self.keys = _key(pid[self.calls], corr[self.calls])
        self.ranges = innermost_enclosing(track[self.calls], start[self.calls], track, start, dur, parent, ranges)

    def call(self, pid: np.ndarray, corr: np.ndarray) -> np.ndarray:
        """Row of the runtime call with each (pid, corr), -1 if none."""
        return np.where(corr >= 0, lookup(_key(pid, corr), self.keys, self.calls), -1)

    def enclosing(self, pid: np.ndarray, corr: np.ndarray) -> np.ndarray:
        """Row of the NVTX range enclosing the runtime call with each (pid, corr), -1 if none."""
        return np.where(corr >= 0, lookup(_key(pid, corr), self.keys, self.ranges), -1)


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
    if None not in shared:
        first["shared memory"] = shared[0] + shared[1]
    return {**first, **values}


def _non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _value_sql(column: str, dtype: pa.DataType | None) -> str:
    """The column in a SELECT; one without a declared type may hold BLOBs, which are read as hex."""
    quoted = _quote(column)
    return quoted if dtype is not None else f"CASE WHEN typeof({quoted}) = 'blob' THEN hex({quoted}) ELSE {quoted} END"


def _arrow_type(declared: str) -> pa.DataType | None:
    """The Arrow type for an SQLite declared column type (by SQLite's affinity rules); None to infer."""
    declared = declared.upper()
    if "INT" in declared:
        return pa.int64()
    if any(word in declared for word in ("CHAR", "CLOB", "TEXT")):
        return pa.string()
    if any(word in declared for word in ("REAL", "FLOA", "DOUB")):
        return pa.float64()
    return None


def _references(sql: str) -> dict[str, str]:
    """Column → StringIds or ENUM_* table, from the `-- REFERENCES T(id)` comments of nsys's CREATE TABLE."""
    found = {}
    for line in sql.splitlines():
        column = line.strip().split(maxsplit=1)
        match = _REFERENCE.search(line)
        if match and column:
            found[column[0]] = match.group(1)
    return found


def _combine(values: pa.ChunkedArray | pa.Array) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _ints(t: pa.Table, column: str, missing: int = -1) -> np.ndarray:
    """An integer column as int64 numpy, nulls (and an absent column) as `missing`."""
    if column not in t.column_names:
        return np.full(t.num_rows, missing, dtype=np.int64)
    return _combine(t[column]).cast(pa.int64()).fill_null(missing).to_numpy().astype(np.int64, copy=False)


def _global_ids(t: pa.Table, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(pid, tid) decoded from an nsys serialized GlobalId (-1 where it is null)."""
    ids = _ints(t, column)
    valid = ids >= 0
    return np.where(valid, (ids >> 24) & 0xFFFFFF, -1), np.where(valid, ids & 0xFFFFFF, -1)


def _key(pid: np.ndarray, corr: np.ndarray) -> np.ndarray:
    """One int64 per (pid, correlation id): CUPTI correlation ids are 32-bit and counted per process."""
    return (pid.astype(np.int64) << 32) | (corr.astype(np.int64) & 0xFFFFFFFF)


def _blank_to_null(values: pa.Array) -> pa.Array:
    return pc.if_else(pc.equal(values, ""), pa.scalar(None, pa.string()), values)


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
            labels.append(thread + _LANES[lane_index])
    return track.astype(np.int64), labels
