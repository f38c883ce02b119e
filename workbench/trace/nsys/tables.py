"""Table access for the Nsight Systems SQLite reader (`workbench.trace.nsys.reader`): one export's tables as
Arrow, its StringIds and ENUM_* lookups, and the args JSON of its rows.

Exports are read leniently, because real ones are not always clean:

- text is decoded as UTF-8 with invalid bytes replaced (U+FFFD): nsys 2022 writes a binary protobuf
  into `TARGET_INFO_SYSTEM_ENV.value`; a BLOB in a TEXT column (or in `StringIds.value`) is read as
  the text its bytes spell, a BLOB in any other column as hex;
- rows whose `start` or `end` is not an integer within ±2**62 ns (a REAL past int64, text, a
  sentinel near int64's bounds) are left out and counted in `dropped`: two such times would no longer
  subtract within int64;
- every other value is read through one typed path (`_value_sql`), by the column's declared type: in an
  INTEGER column that the reader maps or resolves (times, ids, StringIds and ENUM_* references) a value
  that is not an integer (a REAL such as 1.5, ±inf or 1e300, text such as `'3x'`, a BLOB) reads as null,
  and so do text, BLOBs and ±inf in such a REAL column; a numeric column that only goes to args keeps
  what the export wrote (text as text, 1.5 as 1.5, a BLOB as hex) but ±inf, which JSON cannot hold; in a
  column without a declared type, ±inf reads as null and a mix of types no Arrow column holds is read as
  text. Each such value is counted per `table.column` in `coerced` (SQLite stores NaN as NULL: a null);
- a table nsys did not create (it creates them lazily; old exports lack newer ones) reads as empty,
  and ENUM_* tables an old export lacks fall back to the labels of current nsys (`DEFAULT_ENUMS`).

SQLite errors are turned into `TraceFormatError` by `open_export`.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from workbench.errors import TraceFormatError, WorkbenchError
from workbench.trace.columns import dict_array, json_labels, json_objects, json_values
from workbench.trace.schema import TIME_LIMIT_NS

KERNELS = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
OVERHEAD = "CUPTI_ACTIVITY_KIND_OVERHEAD"
SYNCHRONIZATION = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
NVTX = "NVTX_EVENTS"
MEMORY = "CUDA_GPU_MEMORY_USAGE_EVENTS"

_TIME_COLUMNS = ("start", "end")
_REAL_MAX = "1.7976931348623157e308"  # the largest finite double: ±inf lie outside ±_REAL_MAX
_FETCH_ROWS = 65536
_SAMPLE_ROWS = 4096
_IN_BATCH = 900  # ids per `IN (...)` (SQLite's historic limit on bound parameters is 999)
_REFERENCE = re.compile(r"REFERENCES\s+(StringIds|ENUM_\w+)\s*\(\s*id\s*\)")
_DEFAULT_REFERENCES = {  # for exports (old ones, hand-made databases) whose schema carries no such comments
    KERNELS: {"shortName": "StringIds", "mangledName": "StringIds", "launchType": "ENUM_CUDA_KERNEL_LAUNCH_TYPE"},
    MEMCPY: {"copyKind": "ENUM_CUDA_MEMCPY_OPER", "srcKind": "ENUM_CUDA_MEM_KIND", "dstKind": "ENUM_CUDA_MEM_KIND"},
    MEMSET: {"memKind": "ENUM_CUDA_MEM_KIND"},
    RUNTIME: {"eventClass": "ENUM_NSYS_EVENT_CLASS"},
    SYNCHRONIZATION: {"syncType": "ENUM_CUPTI_SYNC_TYPE"},
    OVERHEAD: {"overheadType": "ENUM_CUPTI_OVERHEAD_TYPE"},
    NVTX: {"eventType": "ENUM_NSYS_EVENT_TYPE", "jsonTextId": "StringIds"},
    MEMORY: {"memKind": "ENUM_CUDA_MEM_KIND", "memoryOperationType": "ENUM_CUDA_DEV_MEM_EVENT_OPER"},
}


def _labels(*labels: str, first: int = 0) -> dict[int, str]:
    return dict(enumerate(labels, start=first))


DEFAULT_ENUMS: dict[str, dict[int, str]] = {
    "ENUM_CUDA_MEMCPY_OPER": _labels(
        "Unknown", "Host-to-Device", "Device-to-Host", "Host-to-Array", "Array-to-Host", "Array-to-Array",
        "Array-to-Device", "Device-to-Array", "Device-to-Device", "Host-to-Host", "Peer-to-Peer",
        "Unified Host-to-Device", "Unified Device-to-Host", "Unified Device-to-Device"),
    "ENUM_CUDA_MEM_KIND": _labels("Pageable", "Pinned", "Device", "Array", "Managed", "Device Static",
                                  "Managed Static", "Unknown"),
    "ENUM_CUDA_KERNEL_LAUNCH_TYPE": _labels("Unknown", "Regular", "Coop Single Device", "Coop Multi Device"),
    "ENUM_CUPTI_SYNC_TYPE": _labels("Unknown", "Event sync", "Stream wait sync", "Stream sync", "Context sync"),
    "ENUM_CUDA_DEV_MEM_EVENT_OPER": _labels("Allocation", "Deallocation"),
    "ENUM_NSYS_EVENT_CLASS": {0: "CUDA runtime", 1: "CUDA driver", 13: "CUDA EGL driver", 67: "CUDA backtrace",
                              77: "CUDA graph node creation"},
    "ENUM_NSYS_EVENT_TYPE": {
        33: "NvtxCategory", 34: "NvtxMark", 39: "NvtxThread", 59: "NvtxPushPopRange", 60: "NvtxStartEndRange",
        64: "NvtxtCategory", 65: "NvtxtMark", 70: "NvtxtPushPopRange", 71: "NvtxtStartEndRange",
        72: "NvtxtMetaThread", 73: "NvtxtMetaProcess", 74: "NvtxtMetaFileDisplay", 75: "NvtxDomainCreate",
        76: "NvtxDomainDestroy"},
}
"""Labels of the ENUM_* tables the reader resolves, as nsys 2026.2 writes them, for exports without them
(nsys 2022 writes no ENUM_* tables); an export's own table wins where it has one."""


@contextmanager
def open_export(path: Path) -> Iterator[NsysExport]:
    """The export at `path`, opened read-only with lenient text decoding; an SQLite error raised while
    the block reads it becomes a one-line `TraceFormatError` naming the file."""
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise TraceFormatError(path, f"cannot open as SQLite: {exc}") from exc
    con.text_factory = _decode_text
    try:
        yield NsysExport(path, con)
    except sqlite3.DatabaseError as exc:
        if "not a database" in str(exc):
            raise TraceFormatError(path, "not an SQLite database") from exc
        raise TraceFormatError(path, f"corrupt or truncated SQLite database ({_one_line(str(exc))})") from exc
    except UnicodeDecodeError as exc:  # an SQLite error message quoting a corrupt schema's bytes
        message = exc.object.decode("utf-8", "replace") if isinstance(exc.object, bytes) else "?"
        raise TraceFormatError(path, f"corrupt or truncated SQLite database ({_one_line(message)})") from exc
    finally:
        con.close()


@dataclass
class Rows:
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

    def take(self, rows: np.ndarray) -> Rows:
        index = pa.array(rows, pa.int64())
        return Rows(self.table, self.mapped.take(index), self.grouped.take(index), self.grouped_columns,
                    self.single.take(index))


class NsysExport:
    """Read access to one export: its tables as Arrow, and the StringIds and ENUM lookups.

    `rows_read` counts the rows read per table, `dropped` those left out for their times, `coerced` the
    values of the wrong type read as null (or as text), by reason naming `table.column` (see the module
    docstring), and `missing_strings` the StringIds references without an entry.
    """

    def __init__(self, path: Path, con: sqlite3.Connection) -> None:
        self.path = path
        self.con = con
        self.columns: dict[str, dict[str, pa.DataType | None]] = {}
        self.references: dict[str, dict[str, str]] = {}
        for name, sql in con.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall():
            info = con.execute(f"PRAGMA table_info({quote(name)})").fetchall()
            self.references[name] = {**_DEFAULT_REFERENCES.get(name, {}), **_references(sql or "")}
            self.columns[name] = {row[1]: pa.int64() if row[1] in self.references[name] else _arrow_type(row[2] or "")
                                  for row in info}
        try:
            con.execute("SELECT json_array(1)")
        except sqlite3.OperationalError as exc:
            raise WorkbenchError(f"the SQLite library of this Python ({sqlite3.sqlite_version}) lacks the JSON "
                                 "functions the nsys reader needs (built in since SQLite 3.38)") from exc
        self.rows_read: dict[str, int] = {}
        self.dropped: Counter[str] = Counter()
        self.coerced: Counter[str] = Counter()
        self.missing_strings = 0
        self._strings: dict[int, str] = {}
        self._enums: dict[str, dict[int, str]] = {}

    def has(self, table: str, *columns: str) -> bool:
        """Whether the export has `table`, with all of `columns`."""
        return table in self.columns and all(c in self.columns[table] for c in columns)

    def count(self, table: str) -> int:
        return self.con.execute(f"SELECT COUNT(*) FROM {quote(table)}").fetchone()[0]

    def reference(self, table: str, column: str) -> str:
        """The StringIds or ENUM_* table a column refers to (empty if none is known)."""
        return self.references.get(table, {}).get(column, "")

    def read(self, table: str, required: tuple[str, ...] = ()) -> pa.Table:
        """All columns of `table`, typed as declared (an absent table is empty); NULL is null."""
        columns = self._columns(table, required)
        return self._fetch(table, [_value_sql(c, t) for c, t in columns.items()], columns, required, columns)

    def rows(self, table: str, mapped: tuple[str, ...], required: tuple[str, ...] = (),
             grouped: tuple[str, ...] = ()) -> Rows:
        """The `mapped` columns (those the table has) and the others for args (`grouped` always travel
        grouped; see `Rows`). Mapped columns and StringIds/ENUM references are read as their declared type;
        the other numeric columns, which only go to args, as written (see `_value_sql`)."""
        declared = self._columns(table, required)
        typed = set(mapped) | set(self.references.get(table, {}))
        as_written = {c: t for c, t in declared.items() if c not in typed and t in (pa.int64(), pa.float64())}
        columns = {c: None if c in as_written else t for c, t in declared.items()}
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
        t = self._fetch(table, selects, types, required, columns, as_written)
        grouped_array = (t["json_array"].combine_chunks().dictionary_encode() if together
                         else dict_array(np.zeros(t.num_rows, np.int32), ["[]"]))
        return Rows(table, t.select(list(own)), grouped_array, together, t.select(list(single)))

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
        counts = ", ".join(f"count(DISTINCT {quote(c)})" for c in columns)
        sample = f"SELECT {', '.join(map(quote, columns))} FROM {quote(table)} LIMIT {_SAMPLE_ROWS}"
        rows, *distinct = self.con.execute(f"SELECT count(*), {counts} FROM ({sample})").fetchone()
        return {c for c, n in zip(columns, distinct, strict=True) if n > max(16, rows // 16)}

    def _fetch(self, table: str, selects: list[str], types: dict[str, pa.DataType | None],
               required: tuple[str, ...], source: dict[str, pa.DataType | None],
               as_written: dict[str, pa.DataType] | None = None) -> pa.Table:
        """Run one SELECT over the rows of `table` with valid times, in chunks, into Arrow columns named
        and typed by `types`; count the rows left out in `dropped`, and in `coerced` the values of the
        `source` columns read as null and those of the `as_written` ones not of their declared type."""
        chunks: list[list[pa.Array]] = []
        if table in self.columns:
            valid = self._valid_times(table, required)
            self._count_unusable(table, source, valid, as_written or {})
            where = f" WHERE {valid}" if valid else ""
            cursor = self.con.execute(f"SELECT {', '.join(selects)} FROM {quote(table)}{where}")
            while rows := cursor.fetchmany(_FETCH_ROWS):
                values = zip(*rows, strict=True)
                chunks.append([self._array(table, name, v, t) for (name, t), v in zip(types.items(), values,
                                                                                   strict=True)])
            self.rows_read[table] = sum(len(chunk[0]) for chunk in chunks)
        arrays = {}
        for i, (name, dtype) in enumerate(types.items()):
            parts = [chunk[i] for chunk in chunks]
            if dtype is None:  # types inferred chunk by chunk: one for all (text where they differ)
                inferred = {p.type for p in parts} - {pa.null()}
                if len(inferred) > 1:
                    parts = [self._array(table, name, p.to_pylist(), pa.string()) for p in parts]
                    inferred = {pa.string()}
                dtype = inferred.pop() if inferred else pa.int64()
                parts = [p.cast(dtype) if p.type == pa.null() else p for p in parts]
            arrays[name] = pa.chunked_array(parts, type=dtype)
        return pa.table(arrays)

    def _count_unusable(self, table: str, source: dict[str, pa.DataType | None], valid: str,
                        as_written: dict[str, pa.DataType]) -> None:
        """Count, in one pass over `table`, the rows whose times are not `valid` (`dropped`) and, among the
        others, the values of each column that its read (`_value_sql`) turns to null, or, for a column read
        `as_written`, that are not of its declared type (`coerced`)."""
        checked = {c: t for c, t in source.items() if t != pa.string()}  # CAST AS TEXT keeps every value
        if not checked and not valid:
            return
        terms = ["count(*)"] + [f"count({quote(c)}) - count({_value_sql(c, as_written.get(c, t))})"  # what it nulls
                                for c, t in checked.items()]
        where = f" WHERE {valid}" if valid else ""
        kept, *counts = self.con.execute(f"SELECT {', '.join(terms)} FROM {quote(table)}{where}").fetchone()
        if valid:
            self.dropped[table] = self.count(table) - kept
        for (column, dtype), n in zip(checked.items(), counts, strict=True):
            if n:
                self.coerced[_coerced_reason(table, column, as_written.get(column, dtype), column in as_written)] = n

    def _array(self, table: str, column: str, values: Sequence[Any], dtype: pa.DataType | None) -> pa.Array:
        """Fetched values as an Arrow array of `dtype`; values of a column without a declared type that no
        one Arrow type holds (integers and text...) are read as text, counted in `coerced`."""
        try:
            return pa.array(values, type=dtype)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            if dtype not in (None, pa.string()):  # `_value_sql` gives values of this type only
                raise
        self.coerced[f"{table}.{column}: values of mixed types (read as text)"] += sum(
            not isinstance(v, str) for v in values if v is not None)
        return pa.array([v if v is None or isinstance(v, str) else str(v) for v in values], pa.string())

    def _valid_times(self, table: str, required: tuple[str, ...]) -> str:
        """SQL condition of a row whose `start` and `end` are integers within ±TIME_LIMIT_NS (a column not
        in `required` may also be NULL, as the end of an NVTX mark is); empty for a table without them."""
        conditions = []
        for column in (c for c in _TIME_COLUMNS if c in self.columns[table]):
            q = quote(column)
            valid = f"(typeof({q}) = 'integer' AND {q} > {-TIME_LIMIT_NS} AND {q} < {TIME_LIMIT_NS})"
            conditions.append(valid if column in required else f"({q} IS NULL OR {valid})")
        return " AND ".join(conditions)

    def strings(self, ids: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[str]]:
        """(codes, texts) of StringIds references; code -1 where the id is null."""
        encoded = combine(ids).cast(pa.int64()).dictionary_encode()
        ids = encoded.dictionary.to_pylist()
        texts = self._texts(ids)
        return encoded.indices.fill_null(-1).to_numpy().astype(np.int32), [texts[i] for i in ids]

    def _texts(self, ids: list[int]) -> dict[int, str]:
        """StringIds values by id, fetched once; an id without an entry (or whose value is NULL) reads
        `StringIds#<id>` (counted)."""
        todo = [i for i in set(ids) if i not in self._strings]
        if todo and self.has("StringIds"):
            for at in range(0, len(todo), _IN_BATCH):
                batch = todo[at:at + _IN_BATCH]
                sql = (f"SELECT id, CAST(value AS TEXT) FROM StringIds WHERE value IS NOT NULL "
                       f"AND id IN ({', '.join('?' * len(batch))})")
                self._strings.update(self.con.execute(sql, batch).fetchall())
        for i in todo:
            if i not in self._strings:
                self.missing_strings += 1
                self._strings[i] = f"StringIds#{i}"
        return {i: self._strings[i] for i in ids}

    def enum(self, table: str) -> dict[int, str]:
        """Labels (or names) of an ENUM_* table by id; `DEFAULT_ENUMS` (or nothing) where the export lacks it."""
        if table not in self._enums:
            columns = self.columns.get(table, {})
            text = "label" if "label" in columns else "name"
            rows = []
            if "id" in columns and text in columns:
                rows = self.con.execute(f"SELECT id, CAST({quote(text)} AS TEXT) FROM {quote(table)} "
                                        f"WHERE typeof(id) = 'integer' AND {quote(text)} IS NOT NULL").fetchall()
            self._enums[table] = dict(rows) or DEFAULT_ENUMS.get(table, {})
        return self._enums[table]

    def labels(self, table: str, ids: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[str]]:
        """(codes, labels) of ENUM references, code -1 where the id is null; an id the ENUM table
        lacks is labelled by its number."""
        encoded = combine(ids).cast(pa.int64()).dictionary_encode()
        names = self.enum(table)
        labels = [names.get(i, str(i)) for i in encoded.dictionary.to_pylist()]
        return encoded.indices.fill_null(-1).to_numpy().astype(np.int32), labels

    def args(self, rows: Rows, first: dict[str, pa.Array] | None = None,
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


# -- helpers ----------------------------------------------------------------------------------------

def _one_line(message: str, limit: int = 200) -> str:
    """An SQLite error message on one line and cut to `limit` characters (a corrupt schema's message quotes
    the damaged CREATE TABLE statement, comments and line breaks included)."""
    text = " ".join(message.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _decode_text(raw: bytes) -> str:
    """SQLite TEXT as str: UTF-8, invalid bytes replaced rather than an error for the whole read."""
    return raw.decode("utf-8", errors="replace")


def quote(name: str) -> str:
    """An SQL identifier, quoted."""
    return '"' + name.replace('"', '""') + '"'


def _value_sql(column: str, dtype: pa.DataType | None) -> str:
    """The column in a SELECT, always of its Arrow type (or null): as text where declared TEXT (a BLOB there
    is text bytes, decoded leniently); integers only where declared INTEGER (REAL, text and BLOBs read as
    null); finite numbers only where declared REAL; without a declared type, a BLOB as hex and ±inf as null
    (SQLite would write inf into JSON as `Inf`, which is no JSON)."""
    q = quote(column)
    finite = f"{q} BETWEEN -{_REAL_MAX} AND {_REAL_MAX}"
    if dtype == pa.string():
        return f"CAST({q} AS TEXT)"
    if dtype == pa.int64():
        return f"CASE WHEN typeof({q}) = 'integer' THEN {q} END"
    if dtype == pa.float64():
        return f"CASE WHEN typeof({q}) IN ('integer', 'real') AND {finite} THEN {q} END"
    return f"CASE typeof({q}) WHEN 'blob' THEN hex({q}) WHEN 'real' THEN CASE WHEN {finite} THEN {q} END ELSE {q} END"


def _coerced_reason(table: str, column: str, dtype: pa.DataType | None, as_written: bool = False) -> str:
    """The `coerced` entry of the values that `_value_sql` reads as null (or, for an args column read
    `as_written`, of those not of its declared type)."""
    what = {pa.int64(): "values that are not integers (REAL, text, BLOB)",
            pa.float64(): "values that are not finite numbers (text, BLOB, inf)"}.get(dtype, "inf values")
    return f"{table}.{column}: {what}, " + ("kept in args as written (inf left out)" if as_written else "read as null")


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


def _non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def combine(values: pa.ChunkedArray | pa.Array) -> pa.Array:
    """One contiguous array."""
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def ints(t: pa.Table, column: str, missing: int = -1) -> np.ndarray:
    """An integer column as int64 numpy, nulls (and an absent column) as `missing`."""
    if column not in t.column_names:
        return np.full(t.num_rows, missing, dtype=np.int64)
    return combine(t[column]).cast(pa.int64()).fill_null(missing).to_numpy().astype(np.int64, copy=False)


def global_ids(t: pa.Table, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(pid, tid) decoded from an nsys serialized GlobalId (pid = bits 24-47, tid = bits 0-23; -1 where
    it is null or the column absent)."""
    ids = ints(t, column)
    valid = ids >= 0
    return np.where(valid, (ids >> 24) & 0xFFFFFF, -1), np.where(valid, ids & 0xFFFFFF, -1)


def process_ids(t: pa.Table) -> np.ndarray:
    """The pid of each row: from its `globalPid`, or the pid bits of a `globalTid` where an export has that
    instead (-1 where neither is known)."""
    return global_ids(t, "globalPid" if "globalPid" in t.column_names else "globalTid")[0]


def thread_ids(t: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(pid, tid) of each host row: from its `globalTid`, or just the pid of a `globalPid` where an export
    has no thread (tid -1)."""
    if "globalTid" in t.column_names or "globalPid" not in t.column_names:
        return global_ids(t, "globalTid")
    return global_ids(t, "globalPid")[0], np.full(t.num_rows, -1, dtype=np.int64)
