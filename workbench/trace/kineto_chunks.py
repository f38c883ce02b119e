"""Decode one chunk of Kineto / Chrome trace events into compact columns.

msgspec decodes the chunk into small typed structs (top-level fields, `args` kept as raw JSON
bytes); the args of each class of record are then decoded once more into a struct holding only
the fields that become columns (event args, `[memory]` args). Columns leave the chunk as numpy
arrays and Arrow arrays (strings dictionary-encoded), so a million events cost a few hundred bytes
each, not a Python object each.
"""

from __future__ import annotations

import decimal
import enum
import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import msgspec
import numpy as np
import pyarrow as pa

from workbench.trace.columns import encode_strings
from workbench.trace.jsonstream import ChunkDecodeError
from workbench.trace.kineto_categories import DEVICE_CATEGORIES, KIND_BY_CATEGORY

_EMPTY = msgspec.Raw(b"")
MISSING = -(2**63)
"""Integer columns use this for "absent" (JSON has no integer NaN)."""
EXACT_TS_LIMIT_US = 2.0**43
"""Timestamps (µs) at or past this lose nanoseconds as float64 (its spacing passes 1/1024 µs there):
traces that write absolute epoch µs with three decimals (1.7e15 µs, spacing 0.25 µs) have their
`ts` decoded once more as decimals, relative to a whole-µs base, to keep every nanosecond."""


class Phase(enum.Enum):
    """The `ph` values of the Trace Event Format; decoding to members avoids a string per event."""

    UNKNOWN = ""
    SPAN = "X"
    BEGIN = "B"
    END = "E"
    INSTANT = "i"
    INSTANT_LEGACY = "I"
    COUNTER = "C"
    METADATA = "M"
    FLOW_START = "s"
    FLOW_STEP = "t"
    FLOW_END = "f"
    ASYNC_BEGIN = "b"
    ASYNC_END = "e"
    ASYNC_INSTANT = "n"
    SAMPLE = "P"
    OBJECT_NEW = "N"
    OBJECT_SNAPSHOT = "O"
    OBJECT_DELETE = "D"
    MARK = "R"
    CLOCK_SYNC = "c"
    CONTEXT_ENTER = "("
    CONTEXT_EXIT = ")"


_PHASES = list(Phase)
PHASE_VALUES = [p.value for p in _PHASES]


class _Record(msgspec.Struct, tag_field="ph", forbid_unknown_fields=True, gc=False):
    """A Trace Event Format record with the fields Kineto writes (`s`, an instant's scope, and `bp`,
    a flow's binding point, are read and dropped). Its phase (`ph`) is its class, one per value.

    Other fields of the format (tts, cname, sf, ...) are rare: the slow path keeps them in args.
    """

    name: str = ""
    cat: str | None = None
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    id: int | str = -1
    bp: str | None = None
    s: str | None = None
    args: msgspec.Raw = _EMPTY


class _Flow(msgspec.Struct, tag_field="ph", gc=False):
    """A flow record (`s`, `t`, `f`): nothing of it is kept, so nothing of it is decoded."""


Category = enum.Enum("Category", {c: c for c in sorted({*KIND_BY_CATEGORY, *DEVICE_CATEGORIES})})
"""The categories Kineto is known to write; decoding to members avoids a string per record."""

_CATEGORY_VALUES = [c.value for c in Category]
_CATEGORY_CODE = {id(c): i for i, c in enumerate(Category)} | {id(None): -1}


class _KnownCategoryRecord(_Record):
    """A record whose category is a known one: the fast path (others take `_Record`)."""

    cat: Category | None = None


FLOWS = (Phase.FLOW_START, Phase.FLOW_STEP, Phase.FLOW_END)


def _record_classes(base: type) -> dict[Phase, type]:
    """One struct class per phase (the tagged union's members), each knowing its phase's code."""
    return {p: msgspec.defstruct(f"{base.__name__}_{p.name}", [], bases=(_Flow if p in FLOWS else base,),
                                 tag=p.value, namespace={"phase_code": i})
            for i, p in enumerate(_PHASES) if p is not Phase.UNKNOWN}


_CLASSES = _record_classes(_Record)
_CLASSES[Phase.UNKNOWN] = msgspec.defstruct("_Record_UNKNOWN", [], bases=(_Record,), namespace={"phase_code": 0})
_FAST_CLASSES = _record_classes(_KnownCategoryRecord)
_ROW_FIELDS = ("name", "cat", "pid", "tid", "ts", "dur", "args")
_KNOWN_KEYS = frozenset((*_ROW_FIELDS, "ph", "id", "bp", "s"))


def _codes(phases: tuple[Phase, ...]) -> list[int]:
    return [_PHASES.index(p) for p in phases]


_FLOW_CODES = _codes(FLOWS)
_ASYNC_CODES = _codes((Phase.ASYNC_BEGIN, Phase.ASYNC_END))


class _HostArgs(msgspec.Struct, gc=False):
    """The args fields of host ops and annotations that become columns (the rest stay in raw args)."""

    external_id: int = msgspec.field(default=MISSING, name="External id")
    flops: float = float("nan")
    input_dims: msgspec.Raw = msgspec.field(default=_EMPTY, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_EMPTY, name="Input type")


class _RuntimeArgs(msgspec.Struct, gc=False):
    """The args fields of runtime calls (cudaLaunchKernel, ...) that become columns."""

    external_id: int = msgspec.field(default=MISSING, name="External id")
    correlation: int = MISSING


class _DeviceArgs(msgspec.Struct, gc=False):
    """The args fields of device work (kernels, memcpy, memset) that become columns."""

    external_id: int = msgspec.field(default=MISSING, name="External id")
    external_id_v1: int = msgspec.field(default=MISSING, name="external id")  # Kineto 2021
    correlation: int = MISSING
    device: int = MISSING
    stream: int = MISSING
    bytes: float = float("nan")


_ARG_GROUPS = (_HostArgs, _RuntimeArgs, _DeviceArgs)
_RAW_ARG_FIELDS = ("input_dims", "input_type")


def _arg_group(category: str | None) -> int:
    """Which args struct a category's records decode into (index into `_ARG_GROUPS`)."""
    if category in DEVICE_CATEGORIES:
        return 2
    return 1 if KIND_BY_CATEGORY.get(category or "") == "runtime" else 0


class _MemoryArgs(msgspec.Struct, gc=False):
    """The args of a `[memory]` instant."""

    addr: int = msgspec.field(default=MISSING, name="Addr")
    bytes: int = msgspec.field(default=MISSING, name="Bytes")
    allocated: int = msgspec.field(default=MISSING, name="Total Allocated")
    reserved: int = msgspec.field(default=MISSING, name="Total Reserved")
    device_type: int = msgspec.field(default=MISSING, name="Device Type")
    device_id: int = msgspec.field(default=MISSING, name="Device Id")


EVENT_INTS = ("external_id", "correlation", "device", "stream")
"""Integer columns the assembler reads from each chunk (MISSING where absent)."""
EVENT_FLOATS = ("flops", "bytes")
MEMORY_FIELDS = ("addr", "bytes", "allocated", "reserved", "device_type", "device_id")

_decoders: dict[Any, msgspec.json.Decoder] = {
    t: msgspec.json.Decoder(list[t]) for t in (*_ARG_GROUPS, _MemoryArgs, Any)
}
_record_decoders = [msgspec.json.Decoder(list[Union[tuple(classes[p] for p in _PHASES[1:])]])  # noqa: UP007
                    for classes in (_FAST_CLASSES, _CLASSES)]


class EventSchemaError(Exception):
    """A chunk that is valid JSON but whose events are not trace events."""


@dataclass
class Strings:
    """A dictionary-encoded string column of one chunk: codes (-1 = null) into `values`."""

    codes: np.ndarray
    values: list[str]

    @classmethod
    def encode(cls, items: Any) -> Strings:
        return cls(*encode_strings(items))

    def take(self, rows: np.ndarray) -> Strings:
        return Strings(self.codes[rows], self.values)

    def code(self, value: str) -> int:
        return self.values.index(value) if value in self.values else -2


@dataclass
class Chunk:
    """Columns of one decoded chunk, split by what its records become.

    `events`: columns of the span/instant rows (numpy or Arrow, see `_event_columns`); `rows`: how
    many; `memory`: a structured array of `[memory]` instants; `counters` and `meta`: the few counter
    (`C`) and metadata (`M`) records as tuples; `records`: how many records the chunk held.
    """

    records: int
    rows: int
    events: dict[str, Any]
    memory: np.ndarray
    counters: list[tuple[float, str, dict[str, Any]]] = field(default_factory=list)
    meta: list[tuple[str, int, int, dict[str, Any]]] = field(default_factory=list)
    flows: int = 0
    empty: int = 0
    ts_base_us: int = 0
    """Whole µs the chunk's timestamps (events, memory, counters) are relative to (see EXACT_TS_LIMIT_US)."""

    def rebase(self, base_us: int) -> None:
        """Make the chunk's timestamps relative to `base_us` instead of `ts_base_us`."""
        shift = float(self.ts_base_us - base_us)
        if shift:
            self.events["ts"] = self.events["ts"] + shift
            if len(self.memory):
                self.memory["ts"] += shift
            self.counters = [(ts + shift, name, values) for ts, name, values in self.counters]
        self.ts_base_us = base_us


def decode_chunk(text: bytes) -> Chunk:
    """Decode a JSON array of trace events; `ChunkDecodeError` if it is not valid JSON."""
    for known_categories, decoder in zip((True, False), _record_decoders, strict=True):
        try:
            return _split(decoder.decode(text), known_categories, text)
        except msgspec.ValidationError:
            continue  # an unknown category, field or type: try the next, more general decoder
        except msgspec.DecodeError as exc:
            raise ChunkDecodeError(str(exc)) from exc
    records, empty = _records_loose(text)
    chunk = _split(records, known_categories=False, text=text if not empty else None)
    chunk.records += empty
    chunk.empty = empty
    return chunk


def _columns(structs: Sequence[Any], fields: Sequence[str]) -> dict[str, tuple[Any, ...]]:
    """Field name → the tuple of that field over `structs` (one pass per field: three times faster than
    transposing per-struct tuples with zip(*...))."""
    return {f: tuple(map(operator.attrgetter(f), structs)) for f in fields}


def _gather(items: list[Any], rows: np.ndarray) -> list[Any] | tuple[Any, ...]:
    """items[rows] for a list, in C."""
    if len(rows) == len(items):
        return items
    if len(rows) == 0:
        return []
    return operator.itemgetter(*rows.tolist())(items) if len(rows) > 1 else [items[int(rows[0])]]


class _ExactTs(msgspec.Struct, gc=False):
    """A record's timestamp as written (the other fields are skipped)."""

    ts: decimal.Decimal = decimal.Decimal(0)


_exact_ts_decoder = msgspec.json.Decoder(list[_ExactTs])


def _exact_ts(text: bytes, rows: np.ndarray) -> tuple[np.ndarray, int] | None:
    """The timestamps of records `rows` as float64 µs after a whole-µs base, and that base; None when
    the text's records do not all carry a number there (the float timestamps stand then)."""
    try:
        records = _exact_ts_decoder.decode(text)
        exact = [records[i].ts for i in rows.tolist()]
    except (msgspec.DecodeError, IndexError):
        return None
    if not exact:
        return None
    base = int(min(exact))
    return np.fromiter((float(t - base) for t in exact), dtype=np.float64, count=len(exact)), base


def _split(records: list[Any], known_categories: bool, text: bytes | None = None) -> Chunk:
    """The chunk's columns from its decoded `records`; `text` (their JSON) is read again for exact
    timestamps when the float ones have lost nanoseconds (see EXACT_TS_LIMIT_US)."""
    n = len(records)
    phase = np.fromiter(map(operator.attrgetter("phase_code"), records), dtype=np.int32, count=n)
    is_flow = np.isin(phase, _FLOW_CODES)
    flows = int(is_flow.sum())
    kept = np.arange(n)
    if flows:
        kept = np.flatnonzero(~is_flow)
        records, phase = _gather(records, kept), phase[kept]
    fields = (*_ROW_FIELDS, "id") if np.isin(phase, _ASYNC_CODES).any() else _ROW_FIELDS
    cols = _columns(records, fields)
    del records
    ph = Strings(phase, PHASE_VALUES)
    name = Strings.encode(cols["name"])
    args: tuple[msgspec.Raw, ...] = cols["args"]
    instant = np.isin(ph.codes, [ph.code("i"), ph.code("I")])
    is_memory = instant & (name.codes == name.code("[memory]"))
    is_counter = ph.codes == ph.code("C")
    is_meta = ph.codes == ph.code("M")
    keep = ~(is_memory | is_counter | is_meta)
    rows = np.flatnonzero(keep)
    pid = _ints(cols["pid"])
    tid = _ints(cols["tid"])
    ts = np.fromiter(cols["ts"], dtype=np.float64, count=len(ph.codes))
    base = 0
    if text is not None and len(ts) and np.abs(ts).max() >= EXACT_TS_LIMIT_US and (ts != np.trunc(ts)).any():
        exact = _exact_ts(text, kept)
        if exact is not None and len(exact[0]) == len(ts):
            ts, base = exact
    chunk = Chunk(
        records=n,
        rows=len(rows),
        events=_event_columns(cols, rows, ph, name, pid, tid, ts, keep, known_categories),
        memory=_memory_columns(args, np.flatnonzero(is_memory), pid, tid, ts),
        flows=flows,
        ts_base_us=base,
    )
    for i in np.flatnonzero(is_counter).tolist():
        chunk.counters.append((float(ts[i]), cols["name"][i], _json_object(args[i])))
    for i in np.flatnonzero(is_meta).tolist():
        chunk.meta.append((cols["name"][i], int(pid[i]), int(tid[i]), _json_object(args[i])))
    return chunk


def _event_columns(cols: dict[str, tuple], rows: np.ndarray, ph: Strings, name: Strings,
                   pid: np.ndarray, tid: np.ndarray, ts: np.ndarray, keep: np.ndarray,
                   known_categories: bool) -> dict[str, Any]:
    """Columns of the span/instant rows of a chunk.

    Columns that no row of the chunk uses are None (`id` without async begin/end pairs, `flops` and
    `bytes` where all are NaN), to keep a million-event trace small while it is assembled.
    """
    everything = len(rows) == len(ts)
    args = cols["args"] if everything else tuple(itertools.compress(cols["args"], keep))
    raw, present = raw_strings(args)
    n = len(rows)
    cats = cols["cat"] if everything else tuple(itertools.compress(cols["cat"], keep))
    cat = Strings(np.fromiter(map(_CATEGORY_CODE.__getitem__, map(id, cats)), dtype=np.int32, count=n),
                  _CATEGORY_VALUES) if known_categories else Strings.encode(cats)
    out: dict[str, Any] = {
        "ph": ph.take(rows),
        "name": name.take(rows),
        "cat": cat,
        "pid": pid[rows],
        "tid": tid[rows],
        "ts": ts[rows],
        "dur": np.fromiter(cols["dur"] if everything else itertools.compress(cols["dur"], keep),
                           dtype=np.float64, count=n),
        "id": _ints(cols["id"] if everything else tuple(itertools.compress(cols["id"], keep)))
        if "id" in cols else None,
        "args": raw,
        **{key: np.full(n, MISSING, dtype=np.int64) for key in EVENT_INTS},
        **dict.fromkeys(EVENT_FLOATS),
        "shapes": None,
        "dtypes": None,
    }
    group = np.array([_arg_group(c) for c in cat.values] + [0], dtype=np.int8)[cat.codes]
    for code, kind in enumerate(_ARG_GROUPS):
        where = np.flatnonzero((group == code) & present)
        if len(where):
            _typed_columns(kind, _gather(args, where), where, out)
    ext_v1 = out.pop("external_id_v1", None)  # Kineto 2021 kernels spell it "external id"
    if ext_v1 is not None:
        np.copyto(out["external_id"], ext_v1, where=out["external_id"] == MISSING)
    for key in ("shapes", "dtypes"):
        if out[key] is None:
            out[key] = pa.nulls(n, pa.string())
    return out


def _typed_columns(kind: type, args: Sequence[msgspec.Raw], where: np.ndarray, out: dict[str, Any]) -> None:
    """Decode `args` (the raw args of rows `where`) as `kind` and write its fields into `out`."""
    typed = _decode_args(kind, args)
    fields = tuple(f.name for f in msgspec.structs.fields(kind))
    values = _columns(typed, fields)
    n = len(out["ts"])
    for key, column in values.items():
        if key in _RAW_ARG_FIELDS:
            out["shapes" if key == "input_dims" else "dtypes"] = _spread_raw(column, where, n)
            continue
        float_column = key in EVENT_FLOATS
        target = out.get(key)
        if target is None:
            target = out[key] = np.full(n, np.nan if float_column else MISSING,
                                        dtype=np.float64 if float_column else np.int64)
        target[where] = np.fromiter(column, dtype=target.dtype, count=len(where))
    for key in EVENT_FLOATS:
        if out[key] is not None and np.isnan(out[key]).all():
            out[key] = None


def _memory_columns(args: tuple[msgspec.Raw, ...], rows: np.ndarray, pid: np.ndarray, tid: np.ndarray,
                    ts: np.ndarray) -> np.ndarray:
    """`[memory]` instants as a structured array (ts in µs, thread, fields; MISSING if absent)."""
    out = np.empty(len(rows), dtype=[("ts", "f8"), ("pid", "i8"), ("tid", "i8")]
                   + [(f, "i8") for f in MEMORY_FIELDS])
    out["ts"], out["pid"], out["tid"] = ts[rows], pid[rows], tid[rows]
    if not len(rows):
        return out
    mem_args = _gather(args, rows)
    where = np.flatnonzero(np.fromiter(map(len, mem_args), dtype=np.int64, count=len(rows)) > 0)
    typed = _decode_args(_MemoryArgs, _gather(mem_args, where)) if len(where) else []
    for key, column in _columns(typed, MEMORY_FIELDS).items():
        out[key] = _spread(column, where, len(rows), np.int64, MISSING)
    return out


def _records_loose(text: bytes) -> tuple[list[Any], int]:
    """Slow path for records with fields, types or phases the typed structs do not declare.

    Unknown top-level fields, values of unexpected types and unknown phases are kept in args. Empty
    records (`{}`, which JAX writes to close its trace) are not rows: they are counted and returned.
    """
    try:
        items = _decoders[Any].decode(text)
    except msgspec.DecodeError as exc:  # the typed decoders stopped at a field before a wrong cut
        raise ChunkDecodeError(str(exc)) from exc
    records = []
    empty = 0
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise EventSchemaError(f"traceEvents[{i}] is {type(item).__name__}, not an object")
        if not item:
            empty += 1
            continue
        args = item.get("args")
        kept = {k: v for k, v in item.items() if k not in _KNOWN_KEYS}
        if args is not None and not isinstance(args, dict):
            kept["args"], args = args, None
        phase = item.get("ph", "")
        if phase not in PHASE_VALUES:
            kept["ph"], phase = phase, ""
        cls = _CLASSES[Phase(phase)]
        if issubclass(cls, _Flow):
            records.append(cls())
            continue
        fields: dict[str, Any] = {}
        for key, types in (("name", str), ("cat", str), ("pid", (int, str)), ("tid", (int, str)),
                           ("id", (int, str)), ("ts", (int, float)), ("dur", (int, float))):
            value = item.get(key)
            if value is None:
                continue
            if isinstance(value, types) and not isinstance(value, bool):
                fields[key] = float(value) if key in ("ts", "dur") else value
            elif key in ("name", "cat"):
                fields[key] = str(value)
            else:
                kept[key] = value
        merged = {**(args or {}), **kept}
        raw = msgspec.json.encode(merged) if merged or args is not None else b""
        records.append(cls(**fields, args=msgspec.Raw(raw)))
    return records, empty


def _decode_args(kind: type, args: Sequence[msgspec.Raw]) -> list[Any]:
    """Decode raw args objects into `kind` structs (fields of unexpected type are left out)."""
    text = b"[" + b",".join(args) + b"]"
    try:
        return _decoders[kind].decode(text)
    except msgspec.ValidationError:
        return [_struct_loose(kind, item) for item in _decoders[Any].decode(text)]


def _struct_loose(kind: type, item: Any) -> Any:
    values: dict[str, Any] = {}
    for f in msgspec.structs.fields(kind) if isinstance(item, dict) else ():
        if f.encode_name not in item:
            continue
        value = item[f.encode_name]
        if f.type is msgspec.Raw:
            values[f.name] = msgspec.Raw(msgspec.json.encode(value))
            continue
        try:
            values[f.name] = msgspec.convert(value, f.type)
        except msgspec.ValidationError:
            continue
    return kind(**values)


def raw_strings(values: tuple[msgspec.Raw, ...]) -> tuple[pa.Array, np.ndarray]:
    """An Arrow string array of raw JSON values (empty → null) and the mask of present ones."""
    n = len(values)
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=n)
    present = lengths > 0
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    large = offsets[-1] >= 2**31
    validity = None if present.all() else pa.py_buffer(np.packbits(present, bitorder="little"))
    array = pa.Array.from_buffers(
        pa.large_string() if large else pa.string(), n,
        [validity, pa.py_buffer(offsets if large else offsets.astype(np.int32)),
         pa.py_buffer(b"".join(values))],
        null_count=int(n - present.sum()),
    )
    return array, present


def _ints(values: tuple[Any, ...]) -> np.ndarray:
    """int64 column of pid/tid/id values; text values give their digits ("stream 7" → 7) or -1."""
    n = len(values)
    try:
        return np.fromiter(values, dtype=np.int64, count=n)
    except (TypeError, ValueError, OverflowError):
        pass
    is_int = np.fromiter(map(isinstance, values, itertools.repeat(int)), dtype=bool, count=n)
    numbers = np.full(n, -1, dtype=np.int64)
    numbers[is_int] = np.fromiter(itertools.compress(values, is_int), dtype=np.int64, count=int(is_int.sum()))
    for i in np.flatnonzero(~is_int).tolist():
        digits = "".join(c for c in str(values[i]) if c.isdigit())
        numbers[i] = int(digits[-18:]) if digits else -1
    return numbers


def _spread(values: tuple[Any, ...], where: np.ndarray, n: int, dtype: type, missing: Any) -> np.ndarray:
    """Values of the rows that had args, placed at those rows (`missing` elsewhere)."""
    full = np.full(n, missing, dtype=dtype)
    if len(where):
        full[where] = np.fromiter(values, dtype=dtype, count=len(where))
    return full


def _spread_raw(values: tuple[msgspec.Raw, ...], where: np.ndarray, n: int) -> pa.Array:
    """Raw JSON values of the rows that had args, as strings at those rows (null elsewhere)."""
    if not len(where):
        return pa.nulls(n, pa.string())
    compact, _ = raw_strings(values)
    if len(where) == n:
        return compact
    index = np.full(n, -1, dtype=np.int64)
    index[where] = np.arange(len(where))
    return compact.take(pa.array(index, mask=index < 0))


def _json_object(raw: msgspec.Raw) -> dict[str, Any]:
    value = msgspec.json.decode(raw) if len(raw) else {}
    return value if isinstance(value, dict) else {"args": value}
