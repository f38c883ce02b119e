"""Decode one chunk of Kineto / Chrome trace events into compact columns.

msgspec decodes the chunk into small typed structs (top-level fields, `args` kept as raw JSON
bytes); the args of each class of record are then decoded once more into a struct holding only
the fields that become columns (event args, `[memory]` args). Columns leave the chunk as numpy
arrays and Arrow arrays (strings dictionary-encoded), so a million events cost a few hundred bytes
each, not a Python object each.

A chunk depends on its own text only (it may be decoded in another process): what it cannot turn
into columns it counts in `Chunk.skipped`, and ids that are names carry their text in `Chunk.names`.
"""

from __future__ import annotations

import enum
import itertools
import math
import operator
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from workbench.trace.columns import encode_strings, raw_strings
from workbench.trace.kineto.categories import DEVICE_CATEGORIES, KIND_BY_CATEGORY
from workbench.trace.kineto.jsonstream import ChunkDecodeError
from workbench.trace.kineto.records import (
    ASYNC_CODES,
    CATEGORY_CODE,
    CATEGORY_VALUES,
    EMPTY,
    FLOW_CODES,
    LEGACY_CODES,
    PHASE_VALUES,
    ROW_FIELDS,
    phase_codes,
    record_decoders,
    records_loose,
)
from workbench.trace.kineto.values import (
    MISSING,
    TS_LIMIT_US,
    Int64,
    coerce_ids,
    decode_json,
    encode_json,
    exact_timestamps,
    id_text,
    json_object,
)


class _HostArgs(msgspec.Struct, gc=False):
    """The args fields of host ops and annotations that become columns (the rest stay in raw args)."""

    external_id: Int64 = msgspec.field(default=MISSING, name="External id")
    flops: float = float("nan")
    input_dims: msgspec.Raw = msgspec.field(default=EMPTY, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=EMPTY, name="Input type")


class _RuntimeArgs(msgspec.Struct, gc=False):
    """The args fields of runtime calls (cudaLaunchKernel, ...) that become columns."""

    external_id: Int64 = msgspec.field(default=MISSING, name="External id")
    correlation: Int64 = MISSING


class _DeviceArgs(msgspec.Struct, gc=False):
    """The args fields of device work (kernels, memcpy, memset) that become columns."""

    external_id: Int64 = msgspec.field(default=MISSING, name="External id")
    external_id_v1: Int64 = msgspec.field(default=MISSING, name="external id")  # Kineto 2021
    correlation: Int64 = MISSING
    device: Int64 = MISSING
    stream: Int64 = MISSING
    bytes: float = float("nan")
    size: float = float("nan")  # MTIA dma_request: the bytes copied


_ARG_GROUPS = (_HostArgs, _RuntimeArgs, _DeviceArgs)
_RAW_ARG_FIELDS = ("input_dims", "input_type")


def _arg_group(category: str | None) -> int:
    """Which args struct a category's records decode into (index into `_ARG_GROUPS`)."""
    if category in DEVICE_CATEGORIES:
        return 2
    return 1 if KIND_BY_CATEGORY.get(category or "") == "runtime" else 0


class _MemoryArgs(msgspec.Struct, gc=False):
    """The args of a `[memory]` instant."""

    addr: Int64 = msgspec.field(default=MISSING, name="Addr")
    bytes: Int64 = msgspec.field(default=MISSING, name="Bytes")
    allocated: Int64 = msgspec.field(default=MISSING, name="Total Allocated")
    reserved: Int64 = msgspec.field(default=MISSING, name="Total Reserved")
    device_type: Int64 = msgspec.field(default=MISSING, name="Device Type")
    device_id: Int64 = msgspec.field(default=MISSING, name="Device Id")


EVENT_INTS = ("external_id", "correlation", "device", "stream")
"""Integer columns the assembler reads from each chunk (MISSING where absent)."""
EVENT_FLOATS = ("flops", "bytes")
MEMORY_FIELDS = ("addr", "bytes", "allocated", "reserved", "device_type", "device_id")

_decoders: dict[Any, msgspec.json.Decoder] = {t: msgspec.json.Decoder(list[t]) for t in (*_ARG_GROUPS, _MemoryArgs)}

_COUNTER_CODES = phase_codes(["C"])
BAD_TS = "records whose ts is not a number (not rows)"
FAR_TS = "records whose ts is out of range, |ts| >= 2^62 ns (not rows)"
LOOSE_ARGS = "args values of an unexpected type or past int64 (kept in args only)"
NOT_UTF8_ARGS = "args holding bytes that are not UTF-8 (decoded with U+FFFD)"


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
    many; `memory`: a structured array of `[memory]` instants; `counters` (ts, pid, id, name, values)
    and `meta` (name, pid, tid, values): the few counter (`C`) and metadata (`M`) records as tuples;
    `records`: how many records the chunk held; `names`: the text of pids/tids that are names;
    `skipped`: records and values not kept as written, by reason.
    """

    records: int
    rows: int
    events: dict[str, Any]
    memory: np.ndarray
    counters: list[tuple[float, int, str | None, str, dict[str, Any]]] = field(default_factory=list)
    meta: list[tuple[str, int, int, dict[str, Any]]] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)
    skipped: Counter[str] = field(default_factory=Counter)
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
            self.counters = [(ts + shift, *rest) for ts, *rest in self.counters]
        self.ts_base_us = base_us


def decode_chunk(text: bytes) -> Chunk:
    """Decode a JSON array of trace events; `ChunkDecodeError` if it is not valid JSON."""
    for known_categories, decoder in zip((True, False), record_decoders, strict=True):
        try:
            return _split(decoder.decode(text), known_categories, text)
        except msgspec.ValidationError:
            continue  # an unknown category, field or type: try the next, more general decoder
        except msgspec.DecodeError as exc:
            raise ChunkDecodeError(str(exc)) from exc
    records, empty = records_loose(text)
    chunk = _split(records, known_categories=False, text=text if not empty else None)
    chunk.records += empty
    chunk.empty = empty
    return chunk


def _columns(structs: Sequence[Any], fields: Sequence[str]) -> dict[str, tuple[Any, ...]]:
    """Field name → the tuple of that field over `structs` (one pass per field: three times faster than
    transposing per-struct tuples with zip(*...))."""
    return {f: tuple(map(operator.attrgetter(f), structs)) for f in fields}


def _gather(items: Sequence[Any], rows: np.ndarray) -> Sequence[Any]:
    """items[rows] for a list, in C."""
    if len(rows) == len(items):
        return items
    if len(rows) == 0:
        return []
    return operator.itemgetter(*rows.tolist())(items) if len(rows) > 1 else [items[int(rows[0])]]


def _split(records: list[Any], known_categories: bool, text: bytes | None = None) -> Chunk:
    """The chunk's columns from its decoded `records`; `text` (their JSON) is read again for exact
    timestamps when the float ones have lost nanoseconds (see EXACT_TS_LIMIT_US). Records whose `ts` is
    no number or out of range (`TS_LIMIT_US`) are counted and dropped (metadata records need no `ts`)."""
    n = len(records)
    phase = np.fromiter(map(operator.attrgetter("phase_code"), records), dtype=np.int32, count=n)
    is_flow = np.isin(phase, FLOW_CODES)
    flows = int(is_flow.sum())
    kept = np.arange(n)
    if flows:
        kept = np.flatnonzero(~is_flow)
        records, phase = _gather(records, kept), phase[kept]
    has_async = bool(np.isin(phase, ASYNC_CODES).any())
    has_ids = has_async or bool(np.isin(phase, _COUNTER_CODES).any())  # async records and counters read ids
    cols = _columns(records, (*ROW_FIELDS, *(("id",) if has_ids else ()), *(("id2",) if has_async else ())))
    del records
    ph = Strings(phase, PHASE_VALUES)
    name = Strings.encode(cols["name"])
    args: tuple[msgspec.Raw, ...] = cols["args"]
    skipped: Counter[str] = Counter()
    is_meta = ph.codes == ph.code("M")
    ts = np.fromiter(cols["ts"], dtype=np.float64, count=len(ph.codes))
    nan_ts = np.isnan(ts) & ~is_meta
    far_ts = ~(np.abs(ts) < TS_LIMIT_US) & ~nan_ts & ~is_meta
    skipped[BAD_TS] += int(nan_ts.sum())
    skipped[FAR_TS] += int(far_ts.sum())
    valid = ~(nan_ts | far_ts)
    base = 0
    if text is not None:
        exact = exact_timestamps(text, kept, ts, valid & ~is_meta)
        if exact is not None:
            ts, base = exact
    instant = np.isin(ph.codes, [ph.code("i"), ph.code("I")])
    is_memory = instant & (name.codes == name.code("[memory]")) & valid
    is_counter = (ph.codes == ph.code("C")) & valid
    keep = valid & ~(is_memory | is_counter | is_meta)
    rows = np.flatnonzero(keep)
    pid, names = coerce_ids(cols["pid"])
    tid, tid_names = coerce_ids(cols["tid"])
    names.update(tid_names)
    if "id2" in cols:
        cols["async"] = _async_keys(ph.codes, cols, pid, names)
    chunk = Chunk(
        records=n,
        rows=len(rows),
        events=_event_columns(cols, rows, ph, name, pid, tid, ts, keep, known_categories, skipped),
        memory=_memory_columns(args, np.flatnonzero(is_memory), pid, tid, ts, skipped),
        names=names,
        skipped=skipped,
        flows=flows,
        ts_base_us=base,
    )
    for i in np.flatnonzero(is_counter).tolist():
        ident = cols["id"][i]
        chunk.counters.append((float(ts[i]), int(pid[i]), None if ident is None else id_text(ident),
                               cols["name"][i], json_object(args[i])))
    for i in np.flatnonzero(is_meta).tolist():
        chunk.meta.append((cols["name"][i], int(pid[i]), int(tid[i]), json_object(args[i])))
    return chunk


def _async_keys(phase: np.ndarray, cols: dict[str, tuple], pid: np.ndarray, names: dict[int, str]) -> list[str | None]:
    """Per record, the key that pairs and places async records (None for others, and for those with no id).

    As in Perfetto: `id` or `id2.global` is global to the trace, `id2.local` local to its process;
    both within the category. Legacy async records (`S`/`T`/`p`/`F`) are matched by name too, as the
    Chrome macros that write them take one.
    """
    keys: list[str | None] = [None] * len(phase)
    legacy = np.isin(phase, LEGACY_CODES)
    for i in np.flatnonzero(np.isin(phase, ASYNC_CODES)).tolist():
        ident, id2, scope = cols["id"][i], cols["id2"][i] or {}, ""
        if ident is None and "global" in id2:
            ident = id2["global"]
        elif ident is None and "local" in id2:
            ident, scope = id2["local"], f"pid {names.get(int(pid[i]), pid[i])} "
        if ident is None:
            continue
        cat = cols["cat"][i]
        cat = cat.value if isinstance(cat, enum.Enum) else cat
        key = f"{scope}{cat}:{id_text(ident)}" if cat else f"{scope}{id_text(ident)}"
        keys[i] = f"{key} {cols['name'][i]}" if legacy[i] else key
    return keys


def _event_columns(cols: dict[str, tuple], rows: np.ndarray, ph: Strings, name: Strings,
                   pid: np.ndarray, tid: np.ndarray, ts: np.ndarray, keep: np.ndarray,
                   known_categories: bool, skipped: Counter[str]) -> dict[str, Any]:
    """Columns of the span/instant rows of a chunk.

    Columns that no row of the chunk uses are None (`async` without async records, `flops` and
    `bytes` where all are NaN), to keep a million-event trace small while it is assembled.
    """
    everything = len(rows) == len(ts)

    def kept(column: Sequence[Any]) -> Sequence[Any]:
        return column if everything else tuple(itertools.compress(column, keep))

    args = kept(cols["args"])
    raw, present, not_utf8 = raw_strings(args)
    skipped[NOT_UTF8_ARGS] += not_utf8
    n = len(rows)
    cats = kept(cols["cat"])
    cat = Strings(np.fromiter(map(CATEGORY_CODE.__getitem__, map(id, cats)), dtype=np.int32, count=n),
                  CATEGORY_VALUES) if known_categories else Strings.encode(cats)
    out: dict[str, Any] = {
        "ph": ph.take(rows),
        "name": name.take(rows),
        "cat": cat,
        "pid": pid[rows],
        "tid": tid[rows],
        "ts": ts[rows],
        "dur": np.fromiter(kept(cols["dur"]), dtype=np.float64, count=n),
        "async": Strings.encode(kept(cols["async"])) if "async" in cols else None,
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
            _typed_columns(kind, _gather(args, where), where, out, skipped)
    ext_v1 = out.pop("external_id_v1", None)  # Kineto 2021 kernels spell it "external id"
    if ext_v1 is not None:
        np.copyto(out["external_id"], ext_v1, where=out["external_id"] == MISSING)
    size = out.pop("size", None)  # MTIA DMA requests give their bytes as "size"
    if size is not None:
        out["bytes"] = size if out["bytes"] is None else np.where(np.isnan(out["bytes"]), size, out["bytes"])
    for key in ("shapes", "dtypes"):
        if out[key] is None:
            out[key] = pa.nulls(n, pa.string())
    return out


def _typed_columns(kind: type, args: Sequence[msgspec.Raw], where: np.ndarray, out: dict[str, Any],
                   skipped: Counter[str]) -> None:
    """Decode `args` (the raw args of rows `where`) as `kind` and write its fields into `out`."""
    typed = _decode_args(kind, args, skipped)
    fields = tuple(f.name for f in msgspec.structs.fields(kind))
    values = _columns(typed, fields)
    n = len(out["ts"])
    for key, column in values.items():
        if key in _RAW_ARG_FIELDS:
            out["shapes" if key == "input_dims" else "dtypes"] = _spread_raw(column, where, n)
            continue
        float_column = key in (*EVENT_FLOATS, "size")
        target = out.get(key)
        if target is None:
            target = out[key] = np.full(n, np.nan if float_column else MISSING,
                                        dtype=np.float64 if float_column else np.int64)
        target[where] = np.fromiter(column, dtype=target.dtype, count=len(where))
    for key in (*EVENT_FLOATS, "size"):
        if out.get(key) is not None and np.isnan(out[key]).all():
            out[key] = None


def _memory_columns(args: tuple[msgspec.Raw, ...], rows: np.ndarray, pid: np.ndarray, tid: np.ndarray,
                    ts: np.ndarray, skipped: Counter[str]) -> np.ndarray:
    """`[memory]` instants as a structured array (ts in µs, thread, fields; MISSING if absent)."""
    out = np.empty(len(rows), dtype=[("ts", "f8"), ("pid", "i8"), ("tid", "i8")]
                   + [(f, "i8") for f in MEMORY_FIELDS])
    out["ts"], out["pid"], out["tid"] = ts[rows], pid[rows], tid[rows]
    if not len(rows):
        return out
    mem_args = _gather(args, rows)
    where = np.flatnonzero(np.fromiter(map(len, mem_args), dtype=np.int64, count=len(rows)) > 0)
    typed = _decode_args(_MemoryArgs, _gather(mem_args, where), skipped) if len(where) else []
    for key, column in _columns(typed, MEMORY_FIELDS).items():
        out[key] = _spread(column, where, len(rows), np.int64, MISSING)
    return out


def _decode_args(kind: type, args: Sequence[msgspec.Raw], skipped: Counter[str]) -> list[Any]:
    """Decode raw args objects into `kind` structs (fields of unexpected type are left out, and counted)."""
    text = b"[" + b",".join(args) + b"]"
    try:
        return _decoders[kind].decode(text)
    except msgspec.ValidationError:
        return [_struct_loose(kind, item, skipped) for item in decode_json(text)]


def _struct_loose(kind: type, item: Any, skipped: Counter[str]) -> Any:
    values: dict[str, Any] = {}
    for f in msgspec.structs.fields(kind) if isinstance(item, dict) else ():
        if f.encode_name not in item:
            continue
        value = item[f.encode_name]
        if f.type is msgspec.Raw:
            values[f.name] = msgspec.Raw(encode_json(value))
            continue
        try:
            converted = msgspec.convert(value, f.type)
        except msgspec.ValidationError:
            skipped[LOOSE_ARGS] += 1
            continue
        if isinstance(converted, float) and math.isinf(converted):  # a number past float64 (1e400)
            skipped[LOOSE_ARGS] += 1
            continue
        values[f.name] = converted
    return kind(**values)


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
    compact, _, _ = raw_strings(values)
    if len(where) == n:
        return compact
    index = np.full(n, -1, dtype=np.int64)
    index[where] = np.arange(len(where))
    return compact.take(pa.array(index, mask=index < 0))
