"""Reader for PyTorch profiler (Kineto) and Chrome trace JSON (`.json`, `.json.gz`) into a `Trace`.

Record by record:

| source (`ph`, `cat`/`name`)                  | goes to                                          |
|----------------------------------------------|--------------------------------------------------|
| `X` spans, `i`/`I` instants                  | `events` (kind from the category, see below)     |
| `B`/`E`, async `b`/`e`, legacy async `S`/`F` | `events`: one span per pair (`kineto_pairs`);    |
| pairs; async `n`/`T`/`p` instants            | async ones on `cpu/async <cat>:<id>` tracks      |
| `i` named `[memory]`                         | `memory` (addr, bytes, totals, enclosing op)     |
| `C` counters                                 | `counters`, one row per series (`kineto_tables`) |
| `M` metadata (process/thread names, labels)  | `metadata["processes"]`, `metadata["threads"]`  |
| `s`/`t`/`f` flows                            | not rows: launches are linked through the        |
|                                              | `correlation` ids the flows mirror              |
| anything else, or no `ph` at all             | `events` with kind `other`, `ph` kept in args    |

Kinds come from the category (`kineto_categories`: MTIA command-processor waits and DMA split off by
name), devices and tracks from the category and the process (`kineto_tracks`); a JSON written by
`jax.profiler` beside its XSpace is classified as the XSpace reader does (`kineto_xla`).

Kernels are linked to the host op that launched them through the runtime call with the same
`correlation` id (kernel → `cudaLaunchKernel` → its innermost enclosing op); where no runtime call
matches, through the `External id` that Kineto copies from the op. The two ids are different
number spaces and are never compared with each other.

Nothing is changed silently: `metadata["reader"]["skipped"]` counts, by reason, the records that are
no rows (flows, metadata, timestamps that are no number or out of int64 ns range) and the values not
kept as written (a duration that is negative, no number or would end past int64 ns becomes 0, the
value as written kept in args, as `dur_as_written` where it was a number; ids past int64 stay in args
only); `metadata["reader"]["warnings"]` says what makes the trace doubtful as a whole (no events at
all, malformed `deviceProperties`).

The file is decoded block by block (`jsonstream`); a large uncompressed file on Linux is decoded by
one forked process per usable CPU (up to `MAX_WORKERS`) while this one plans the blocks, then the
blocks' columns are assembled here. The Trace is the same either way.
"""

from __future__ import annotations

import gc
import gzip
import math
import os
import stat
from collections import Counter
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa

from workbench.errors import TraceFormatError
from workbench.trace import schema
from workbench.trace.columns import dict_array, encode_strings
from workbench.trace.kineto import xla as kineto_xla
from workbench.trace.kineto.categories import (
    DEVICE_CATEGORIES,
    DEVICE_RANGE_CATEGORIES,
    KIND_BY_CATEGORY,
    KIND_BY_NAME_PREFIX,
    kind_of,
)
from workbench.trace.kineto.chunks import EVENT_FLOATS, EVENT_INTS, Chunk, Strings, decode_chunk
from workbench.trace.kineto.jsonstream import TraceEventStream, can_fork
from workbench.trace.kineto.pairs import pair_spans
from workbench.trace.kineto.records import EventSchemaError, Phase
from workbench.trace.kineto.tables import counters_table, device_list, device_names, memory_table, names_metadata
from workbench.trace.kineto.tracks import host_thread_tracks, place, track_labels
from workbench.trace.kineto.values import (
    INT64_MAX,
    JSON_DEPTH_LIMIT,
    MISSING,
    decode_json,
    deep_json,
    merge_json,
    plain,
)
from workbench.trace.launches import launchers
from workbench.trace.model import Trace
from workbench.trace.nesting import nest_spans
from workbench.trace.schema import KIND_CODES

_GZIP_MAGIC = b"\x1f\x8b"
_ROW_PHASES = ("X", "i", "I", "B", "b", "n", "S", "T", "p")
_INSTANT_PHASES = ("i", "I", "n", "T", "p")
_LINKED_KINDS = ("runtime", "kernel", "memcpy", "memset")
_UNLABELLED = (Phase.UNKNOWN.value, Phase.ABSENT.value)

MAX_WORKERS = 4
"""Most processes decoding one file (2 is all this project's machines have measured): the assembly
after them runs in one process, and each worker holds about 45 MB (a block, its decoded records and
their way back), so more would buy little time for their memory."""
PARALLEL_MIN_BYTES = 64 << 20
"""Smaller files are decoded in the calling process: the workers' start (each one's first block is
its slowest), the results' trip through a pipe and the uneven last blocks cost about 0.1 s, which
two workers do not surely win back below this. Medians of `benchmarks/ingest.py --events N --parsers
workbench-seq,workbench-par` on 2 CPUs, one process vs workers: load 1.1 (11 runs) 17 MB 0.19 vs
0.21 s, 34 MB 0.38 vs 0.36 s, 67 MB 0.68 vs 0.58 s; load 3 (15 runs) 17 MB 0.14 vs 0.25 s, 34 MB
0.41 vs 0.57 s, 67 MB 0.63 vs 0.57 s."""

UNKNOWN = "records of unknown category or phase (kept, kind other)"
NO_PHASE = "records without 'ph' (kept, kind other)"
NEGATIVE_DUR = "negative durations (set to 0, dur_as_written in args)"
FAR_DUR = "durations ending past int64 ns (set to 0, dur_as_written in args)"
NAN_DUR = "durations that are not numbers (set to 0, kept in args as dur)"


def open_trace_file(path: Path) -> IO[bytes]:
    """Open a trace for reading, decompressing gzip by content (and insisting on it for `.gz`)."""
    try:
        stream: IO[bytes] = open(path, "rb")  # noqa: SIM115 - returned to the caller
    except OSError as exc:
        raise TraceFormatError(path, f"cannot open: {exc.strerror}") from exc
    magic = stream.read(2)
    stream.seek(0)
    if magic == _GZIP_MAGIC:  # reopened by GzipFile, which never closes a file object it is handed
        stream.close()
        try:
            return gzip.GzipFile(path, mode="rb")  # type: ignore[return-value]
        except OSError as exc:
            raise TraceFormatError(path, f"cannot open: {exc.strerror}") from exc
    if path.suffix == ".gz":
        stream.close()
        raise TraceFormatError(path, "not gzip-compressed, although its name ends in .gz")
    return stream


def read_kineto(path: str | os.PathLike[str], workers: int | None = None) -> Trace:
    """Read a Kineto / Chrome trace JSON file into a `Trace` (see the module docstring).

    `workers`: processes decoding the file. None: one per usable CPU, up to `MAX_WORKERS`, for an
    uncompressed file of `PARALLEL_MIN_BYTES` or more, else 1 (this process alone). More than one
    needs an uncompressed regular file and Linux; otherwise the file is decoded here.
    """
    path = Path(path)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of short-lived tuples: the cyclic collector would double the time
    try:
        with deep_json(), open_trace_file(path) as stream:
            events = TraceEventStream(stream, path, decode_chunk)
            processes = decode_processes(stream, workers)
            try:
                chunks = list(events if processes == 1 else events.parallel(processes))
            except EventSchemaError as exc:
                raise TraceFormatError(path, str(exc)) from exc
            return _Assembler(path, chunks, events.header).trace()
    except RecursionError as exc:
        raise TraceFormatError(path, f"JSON nested more than {JSON_DEPTH_LIMIT:,} levels deep") from exc
    finally:
        if gc_was_enabled:
            gc.enable()


def decode_processes(stream: IO[bytes], workers: int | None = None) -> int:
    """How many processes `read_kineto` decodes `stream` with (see its `workers`); 1 for gzip input,
    which only this process can read, and for anything that is not a regular file."""
    if isinstance(stream, gzip.GzipFile) or not can_fork():
        return 1
    info = os.fstat(stream.fileno())
    if not stat.S_ISREG(info.st_mode):
        return 1
    if workers is None:
        workers = min(MAX_WORKERS, len(os.sched_getaffinity(0))) if info.st_size >= PARALLEL_MIN_BYTES else 1
    return max(workers, 1)


def _unify(columns: list[Strings | None], sizes: list[int]) -> tuple[np.ndarray, list[str]]:
    """Concatenate per-chunk dictionary columns into one (a chunk's None is all null): (int32 codes,
    -1 for null; values)."""
    values: dict[str, int] = {}
    parts = []
    for col, size in zip(columns, sizes, strict=True):
        if col is None:
            parts.append(np.full(size, -1, dtype=np.int32))
            continue
        remap = np.array([values.setdefault(v, len(values)) for v in col.values] + [-1], dtype=np.int32)
        parts.append(remap[col.codes])  # code -1 picks the trailing -1
    codes = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    return codes, list(values)


class _Assembler:
    """Turns the decoded chunks of one file into the Trace tables."""

    def __init__(self, path: Path, chunks: list[Chunk], header: dict[str, Any]) -> None:
        self.path = path
        self.chunks = chunks
        self.header = header
        self.skipped: Counter[str] = Counter()
        self.warnings: list[str] = []
        self.names: dict[int, str] = {}
        self.vendor = "cuda"
        self.base_us = 0
        """Whole µs every chunk's timestamps are relative to once `trace` has rebased them."""
        self.keep: np.ndarray | None = None
        """Rows that stay once begins and ends are paired (None: all)."""

    def _concat(self, key: str, missing: Any = None) -> Any:
        """One event column over all chunks (only the rows in `keep` once it is set), released from the
        chunks as it is taken. Chunks that left a numeric column out (None) contribute `missing`; None if all did.
        """
        parts = [c.events.pop(key) for c in self.chunks]
        sizes = [c.rows for c in self.chunks]
        if key in ("ph", "name", "cat", "async"):
            codes, values = _unify(parts, sizes)
            return self._sel(codes), values
        if any(isinstance(p, pa.Array) for p in parts):
            return self._sel(pa.chunked_array(parts, type=pa.string()))
        if all(p is None for p in parts) and missing is not None:
            return None
        column = np.concatenate([np.full(n, missing) if p is None else p for p, n in zip(parts, sizes, strict=True)]) \
            if parts else np.zeros(0)
        return self._sel(column)

    def _sel(self, column: Any) -> Any:
        if self.keep is None:
            return column
        if isinstance(column, pa.ChunkedArray):
            return column.filter(pa.array(self.keep))
        return column[self.keep]

    def trace(self) -> Trace:
        chunks = self.chunks
        self.base_us = min((c.ts_base_us for c in chunks), default=0)
        for chunk in chunks:
            chunk.rebase(self.base_us)
            self.skipped.update(chunk.skipped)
            self.names.update(chunk.names)
        records = sum(c.records for c in chunks)
        self.skipped["flow events (links kept as correlation ids)"] = sum(c.flows for c in chunks)
        self.skipped["empty records ({})"] = sum(c.empty for c in chunks)
        memory_src = np.concatenate([c.memory for c in chunks]) if chunks else np.zeros(0)
        ph_codes, ph_values = self._concat("ph")
        ts, dur, pid, tid = (self._concat(k) for k in ("ts", "dur", "pid", "tid"))
        async_codes, async_values = self._concat("async")
        keep, dur, args = pair_spans(ph_codes, ph_values, pid, tid, async_codes, ts, dur, self._concat("args"),
                                     self.skipped)
        if not keep.all():
            self.keep = keep
            ph_codes, ts, dur, pid, tid, async_codes, args = (
                self._sel(c) for c in (ph_codes, ts, dur, pid, tid, async_codes, args))
        cat_codes, cat_values = self._concat("cat")
        name_codes, name_values = self._concat("name")
        kind = self._kinds(cat_codes, cat_values, name_codes, name_values, ph_codes, ph_values)
        ints = {k: self._concat(k) for k in EVENT_INTS}
        self.vendor = self._vendor([cat_values[c] for c in np.unique(cat_codes).tolist() if c >= 0])
        category = np.array([c in DEVICE_CATEGORIES for c in cat_values] + [False])
        ranges = np.array([c in DEVICE_RANGE_CATEGORIES for c in cat_values] + [False])[cat_codes]
        lanes = place(self.vendor, category[cat_codes], ranges, ints["device"], ints["stream"], pid, tid, async_codes)
        origin_us = self._origin(ts, memory_src)
        start_ns = _to_ns(ts, origin_us)
        dur_ns, written_dur = self._durations(dur, start_ns)
        del ts, dur
        processes, threads = names_metadata([m for c in chunks for m in c.meta], self.names)
        planes = kineto_xla.plane_processes(self._process_names())
        undecided = None
        if planes:
            name_list = np.asarray(name_values, dtype=object)[name_codes].tolist()
            arg_list = args.to_pylist()
            undecided = kineto_xla.classify(planes, self._thread_names(), pid, tid, name_list, arg_list, kind, lanes)
        track, labels = track_labels(lanes, pid, self.names, async_values)
        parent, depth = nest_spans(track, start_ns, dur_ns)
        if undecided is not None:
            kind, name_list, arg_list = kineto_xla.finish(kind, undecided, name_list, arg_list, parent, depth)
            name_codes, name_values = encode_strings(name_list)
            args = pa.chunked_array([pa.array(arg_list, pa.string())])
        host = lanes.device == 0
        linked = np.isin(kind, [KIND_CODES[k] for k in _LINKED_KINDS])
        corr = np.where(linked, ints["correlation"], MISSING)
        device_side_calls = (kind == KIND_CODES["runtime"]) & ~host  # MTIA syncs: no launch to follow
        launcher = launchers(kind, np.where(device_side_calls, MISSING, corr), parent, ints["external_id"],
                             absent=MISSING)
        corr[corr == MISSING] = -1
        args = self._patch_args(args, cat_codes, cat_values, kind, ph_codes, ph_values, written_dur)
        floats = {k: self._concat(k, missing=np.nan) for k in EVENT_FLOATS}
        n = len(kind)
        events = pa.table(
            {
                "start_ns": start_ns,
                "dur_ns": dur_ns,
                "name": dict_array(name_codes, name_values),
                "kind": dict_array(kind, list(schema.KINDS)),
                "device": dict_array(lanes.device, lanes.devices),
                "track": dict_array(track, labels),
                "pid": pid,
                "tid": tid,
                "corr": corr,
                "parent": parent,
                "depth": depth,
                "launcher": launcher,
                "flops": np.full(n, np.nan) if floats["flops"] is None else floats["flops"],
                "bytes": np.full(n, np.nan) if floats["bytes"] is None else floats["bytes"],
                "shapes": self._concat("shapes"),
                "dtypes": self._concat("dtypes"),
                "args": args,
            },
            schema=schema.EVENTS,
        )
        memory = memory_table(memory_src, origin_us, self.vendor, events, host_thread_tracks(lanes, pid, tid, track))
        range_rows = np.flatnonzero(ranges)
        counters = counters_table([r for c in chunks for r in c.counters], origin_us, self.names,
                                  [(int(start_ns[r]), lanes.devices[lanes.device[r]], _object(args[int(r)].as_py()))
                                   for r in range_rows.tolist()], self.skipped)
        return Trace(events=events, memory=memory, counters=counters,
                     metadata=self._metadata(origin_us, records, events.num_rows, len(memory), len(counters),
                                             processes, threads))

    # -- pieces ---------------------------------------------------------------------------------

    def _kinds(self, cat_codes: np.ndarray, cat_values: list[str], name_codes: np.ndarray, name_values: list[str],
               ph_codes: np.ndarray, ph_values: list[str]) -> np.ndarray:
        """Kind code per row: by category (and name, for categories that split by it); instants without
        a category are annotations; rows of phases that are no span or instant are `other`."""
        kind_of_cat = np.array([KIND_CODES[KIND_BY_CATEGORY.get(c, "other")] for c in cat_values]
                               + [KIND_CODES["other"]], dtype=np.int8)
        kind = kind_of_cat[cat_codes]  # code -1 (no category) picks the trailing "other"
        for code, category in enumerate(cat_values):
            if category not in KIND_BY_NAME_PREFIX:
                continue
            rows = np.flatnonzero(cat_codes == code)
            used = np.unique(name_codes[rows])
            by_name = np.zeros(len(name_values), dtype=np.int8)
            by_name[used] = [KIND_CODES[kind_of(category, name_values[c])] for c in used.tolist()]
            kind[rows] = by_name[name_codes[rows]]
        instant = np.isin(ph_codes, [i for i, p in enumerate(ph_values) if p in _INSTANT_PHASES])
        kind[instant & (cat_codes < 0)] = KIND_CODES["annotation"]
        odd = ~np.isin(ph_codes, [i for i, p in enumerate(ph_values) if p in _ROW_PHASES])
        kind[odd] = KIND_CODES["other"]
        return kind

    @staticmethod
    def _origin(ts: np.ndarray, memory: np.ndarray) -> float:
        """The earliest timestamp (µs) of the rows and memory records (metadata records are neither)."""
        candidates = [float(ts.min())] if len(ts) else []
        if len(memory):
            candidates.append(float(memory["ts"].min()))
        return min(candidates) if candidates else 0.0

    def _durations(self, dur_us: np.ndarray, start_ns: np.ndarray) -> tuple[np.ndarray, dict[int, float]]:
        """Durations in ns; one that is negative, no number, or would end past int64 ns (1e300 µs: no
        analysis could add it to a start) becomes 0, counted, and returned by row with the value as written
        (µs) when the args do not hold it yet."""
        ns = dur_us * 1000.0
        room = (INT64_MAX - start_ns).astype(np.float64)
        negative, nan, far = ns < 0, np.isnan(ns), ns >= room - 4096.0  # float64 steps 2048 near 2**63
        out = np.rint(np.where(negative | nan | far, 0.0, ns)).astype(np.int64)
        written: dict[int, float] = {}
        self.skipped[NAN_DUR] += int(nan.sum())  # the loose decoder kept the text in args
        for reason, mask in ((NEGATIVE_DUR, negative), (FAR_DUR, far)):
            rows = np.flatnonzero(mask)
            self.skipped[reason] += len(rows)
            rows = rows[np.isfinite(dur_us[rows])]  # the loose decoder kept an infinite one's text in args
            written.update(zip(rows.tolist(), dur_us[rows].tolist(), strict=True))
        return out, written

    def _process_names(self) -> dict[int, str]:
        return {pid: values["name"] for chunk in self.chunks for name, pid, _, values in chunk.meta
                if name == "process_name" and isinstance(values.get("name"), str)}

    def _thread_names(self) -> dict[tuple[int, int], str]:
        return {(pid, tid): values["name"] for chunk in self.chunks for name, pid, tid, values in chunk.meta
                if name == "thread_name" and isinstance(values.get("name"), str)}

    def _vendor(self, categories: list[str]) -> str:
        """Device prefix from the categories in use: rocm for AMD GPUs (Kineto reuses the cuda
        categories), mtia, xpu or cuda."""
        cats = {c for c in categories if c}
        if any(c.startswith("mtia") for c in cats):
            return "mtia"
        if any(c.startswith("xpu") for c in cats):
            return "xpu"
        names = device_names(self.header)
        rocm = any(w in names for w in ("AMD", "Radeon", "Instinct")) or any(c.startswith("hip") for c in cats)
        return "rocm" if rocm else "cuda"

    def _patch_args(self, args: pa.ChunkedArray, cat_codes: np.ndarray, cat_values: list[str], kind: np.ndarray,
                    ph_codes: np.ndarray, ph_values: list[str], written_dur: dict[int, float]) -> pa.ChunkedArray:
        """Merge into args what the schema has no column for: unknown categories, odd phases, durations
        as written where they were changed."""
        known = np.array([c in KIND_BY_CATEGORY for c in cat_values] + [True])[cat_codes]
        odd_ph = ~np.isin(ph_codes, [i for i, p in enumerate(ph_values) if p in _ROW_PHASES])
        no_ph = ph_codes == (ph_values.index(Phase.ABSENT.value) if Phase.ABSENT.value in ph_values else -2)
        self.skipped[UNKNOWN] += int((~known | (odd_ph & ~no_ph)).sum())
        self.skipped[NO_PHASE] += int(no_ph.sum())
        patch = np.flatnonzero(~known | (odd_ph & ~no_ph))
        if not len(patch) and not written_dur:
            return args
        values = args.to_pylist()
        for i in sorted({*patch.tolist(), *written_dur}):
            extra: dict[str, Any] = {}
            if not known[i]:
                extra["cat"] = cat_values[cat_codes[i]]
            if odd_ph[i] and ph_values[ph_codes[i]] not in _UNLABELLED:  # an unknown phase is already in args
                extra["ph"] = ph_values[ph_codes[i]]
            if i in written_dur:
                extra["dur_as_written"] = written_dur[i]
            values[i] = merge_json(values[i], extra)
        return pa.chunked_array([pa.array(values, pa.string())])

    def _metadata(self, origin_us: float, records: int, n_events: int, n_memory: int, n_counters: int,
                  processes: dict[str, Any], threads: dict[str, Any]) -> dict[str, Any]:
        self.skipped["metadata records (kept in metadata processes/threads)"] += sum(len(c.meta) for c in self.chunks)
        devices, well_formed = device_list(self.header, self.vendor, self.warnings)
        header = {k: v for k, v in self.header.items() if k != "deviceProperties" or not well_formed}
        origin_ns = _absolute_ns(self.base_us, origin_us)
        base = header.get("baseTimeNanoseconds")
        if isinstance(base, int) and not isinstance(base, bool):
            origin_ns += base
        if not n_events:
            self.warnings.insert(0, "no trace events: traceEvents is empty" if not records else
                                 f"no trace events: its {records:,} records are all metadata, flows, counters or "
                                 "memory records")
        return {
            "source": {"format": "kineto", "file": str(self.path), "bytes": self.path.stat().st_size,
                       "header": plain(header)},
            "origin_ns": origin_ns,
            "devices": plain(devices),
            "processes": processes,
            "threads": threads,
            "reader": {"records": records, "events": n_events, "memory": n_memory, "counters": n_counters,
                       "skipped": {k: v for k, v in self.skipped.items() if v},
                       "warnings": self.warnings,
                       "named_ids": {str(k): v for k, v in sorted(self.names.items())}},
        }


def _object(text: str | None) -> dict[str, Any]:
    value = decode_json(text) if text else {}
    return value if isinstance(value, dict) else {}


def _absolute_ns(base_us: int, us: float) -> int:
    """`base_us + us` in integer ns: its whole µs exactly, the rest through `_to_ns` as the event times are (ns of a
    float64 epoch time past 2**53 would be off by up to 128 ns)."""
    whole = math.floor(us)
    return (base_us + whole) * 1000 + int(_to_ns(np.array([us]), whole)[0])


def _to_ns(us: np.ndarray, origin_us: float) -> np.ndarray:
    """Integer ns from µs floats, rounded, with one temporary (the input is overwritten)."""
    us -= origin_us
    us *= 1000.0
    np.rint(us, out=us)
    return us.astype(np.int64)
