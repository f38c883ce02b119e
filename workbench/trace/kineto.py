"""Reader for PyTorch profiler (Kineto) and Chrome trace JSON (`.json`, `.json.gz`) into a `Trace`.

Record by record:

| source (`ph`, `cat`/`name`)                  | goes to                                         |
|----------------------------------------------|-------------------------------------------------|
| `X` spans, `i`/`I` instants, `B`/`E` pairs   | `events` (kind from the category, see below)   |
| `i` named `[memory]`                         | `memory` (addr, bytes, totals, enclosing op)    |
| `C` counters                                 | `counters`, one row per series                  |
| `M` metadata (process/thread names, labels)  | `metadata["processes"]`, `metadata["threads"]` |
| `s`/`t`/`f` flows                            | not rows: launches are linked through the       |
|                                              | `correlation` ids the flows mirror             |
| anything else                                | `events` with kind `other`, `ph` kept in args   |

Kernels are linked to the host op that launched them through the runtime call with the same
`correlation` id (kernel → `cudaLaunchKernel` → its innermost enclosing op); where no runtime call
matches, through the `External id` that Kineto copies from the op. The two ids are different
number spaces and are never compared with each other.

The file is decoded block by block (`jsonstream`); a large uncompressed file on Linux is decoded by
one forked process per usable CPU (up to `MAX_WORKERS`) while this one plans the blocks, then the
blocks' columns are assembled here. The Trace is the same either way.
"""

from __future__ import annotations

import gc
import gzip
import os
import stat
from collections import Counter
from pathlib import Path
from typing import IO, Any

import msgspec
import numpy as np
import pyarrow as pa

from workbench.errors import TraceFormatError
from workbench.trace import schema
from workbench.trace.columns import dict_array, factorize, lookup
from workbench.trace.jsonstream import TraceEventStream, can_fork
from workbench.trace.kineto_categories import DEVICE_CATEGORIES, DEVICE_TYPES, KIND_BY_CATEGORY
from workbench.trace.kineto_chunks import (
    EVENT_FLOATS,
    EVENT_INTS,
    MISSING,
    Chunk,
    EventSchemaError,
    Strings,
    decode_chunk,
)
from workbench.trace.model import Trace
from workbench.trace.nesting import innermost_enclosing, nest_spans

KIND_CODES = {k: i for i, k in enumerate(schema.KINDS)}

_GZIP_MAGIC = b"\x1f\x8b"
_SPAN_PHASES = ("X", "i", "I", "B", "b", "n")

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
        with open_trace_file(path) as stream:
            events = TraceEventStream(stream, path, decode_chunk)
            processes = decode_processes(stream, workers)
            try:
                chunks = list(events if processes == 1 else events.parallel(processes))
            except EventSchemaError as exc:
                raise TraceFormatError(path, str(exc)) from exc
        return _Assembler(path, chunks, events.header).trace()
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


def _unify(columns: list[Strings]) -> tuple[np.ndarray, list[str]]:
    """Concatenate per-chunk dictionary columns into one: (int32 codes, -1 for null; values)."""
    values: dict[str, int] = {}
    parts = []
    for col in columns:
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
        self.vendor = "cuda"
        self.base_us = 0
        """Whole µs every chunk's timestamps are relative to once `trace` has rebased them."""

    def _concat(self, key: str, missing: Any = None) -> Any:
        """One event column over all chunks, released from the chunks as it is taken.

        Chunks that left a numeric column out (None) contribute `missing`; None if all did.
        """
        parts = [c.events.pop(key) for c in self.chunks]
        if key in ("ph", "name", "cat"):
            return _unify(parts)
        if parts and isinstance(parts[0], pa.Array):
            return pa.chunked_array(parts, type=pa.string())
        if all(p is None for p in parts) and missing is not None:
            return None
        sizes = [c.rows for c in self.chunks]
        return np.concatenate([np.full(n, missing) if p is None else p for p, n in zip(parts, sizes, strict=True)]) \
            if parts else np.zeros(0)

    def trace(self) -> Trace:
        chunks = self.chunks
        self.base_us = min((c.ts_base_us for c in chunks), default=0)
        for chunk in chunks:
            chunk.rebase(self.base_us)
        records = sum(c.records for c in chunks)
        self.skipped["flow events (links kept as correlation ids)"] = sum(c.flows for c in chunks)
        self.skipped["empty records ({})"] = sum(c.empty for c in chunks)
        memory_src = np.concatenate([c.memory for c in chunks]) if chunks else np.zeros(0)
        ph_codes, ph_values = self._concat("ph")
        if len(ph_codes) and (ph_codes == ph_values.index("")).all():
            raise TraceFormatError(self.path, "traceEvents entries have no 'ph' field: not trace events")
        ts, dur = self._concat("ts"), self._concat("dur")
        origin_us = self._origin(ts, memory_src)
        pid, tid = self._concat("pid"), self._concat("tid")
        flow_id = self._concat("id", missing=-1)
        args = self._concat("args")
        keep, dur, args = self._pair_begin_end(ph_codes, ph_values, pid, tid, flow_id, ts, dur, args)
        rows = None if keep.all() else np.flatnonzero(keep)

        def sel(column: Any) -> Any:
            if rows is None:
                return column
            if isinstance(column, pa.ChunkedArray):
                return column.take(pa.array(rows))
            return column[rows]

        cat_codes, cat_values = self._concat("cat")
        kind_of_cat = np.array([KIND_CODES[KIND_BY_CATEGORY.get(c, "other")] for c in cat_values]
                               + [KIND_CODES["other"]], dtype=np.int8)
        kind = kind_of_cat[cat_codes]  # code -1 (no category) picks the trailing "other"
        instant = np.isin(ph_codes, [i for i, p in enumerate(ph_values) if p in ("i", "I", "n")])
        kind[instant & (cat_codes < 0)] = KIND_CODES["annotation"]
        on_device = np.array([c in DEVICE_CATEGORIES for c in cat_values] + [False])[cat_codes]
        ints = {k: self._concat(k) for k in EVENT_INTS}
        self.vendor = self._vendor([cat_values[c] for c in np.unique(cat_codes).tolist() if c >= 0])
        device_code = np.where(on_device, np.where(ints["device"] != MISSING, ints["device"], pid), -1)
        lane = np.where(on_device & (ints["stream"] != MISSING), ints["stream"], tid)
        del ints["device"], ints["stream"]  # a million-row trace: free what is no longer needed
        track_codes, track_labels = self._tracks(device_code, lane, pid)
        n_devices = int(device_code.max()) + 1 if len(device_code) else 0
        device_labels = ["cpu"] + [f"{self.vendor}:{d}" for d in range(n_devices)]

        start_ns = sel(_to_ns(ts, origin_us))
        dur_ns = sel(np.maximum(_to_ns(dur, 0.0), 0))
        del ts, dur
        kind, track = sel(kind), sel(track_codes)
        parent, depth = nest_spans(track, start_ns, dur_ns)
        linked = np.isin(kind, [KIND_CODES[k] for k in ("runtime", "kernel", "memcpy", "memset")])
        corr = np.where(linked, sel(ints["correlation"]), MISSING)
        ext = sel(ints["external_id"])
        launcher = _launchers(kind, corr, ext, parent)
        corr[corr == MISSING] = -1
        args = self._patch_args(sel(args), sel(cat_codes), cat_values, kind, sel(ph_codes), ph_values)
        name_codes, name_values = self._concat("name")
        floats = {k: self._concat(k, missing=np.nan) for k in EVENT_FLOATS}
        events = pa.table(
            {
                "start_ns": start_ns,
                "dur_ns": dur_ns,
                "name": dict_array(sel(name_codes), name_values),
                "kind": dict_array(kind, list(schema.KINDS)),
                "device": dict_array(sel(device_code) + 1, device_labels),
                "track": dict_array(track, track_labels),
                "pid": sel(pid),
                "tid": sel(tid),
                "corr": corr,
                "parent": parent,
                "depth": depth,
                "launcher": launcher,
                "flops": np.full(len(kind), np.nan) if floats["flops"] is None else sel(floats["flops"]),
                "bytes": np.full(len(kind), np.nan) if floats["bytes"] is None else sel(floats["bytes"]),
                "shapes": sel(self._concat("shapes")),
                "dtypes": sel(self._concat("dtypes")),
                "args": args,
            },
            schema=schema.EVENTS,
        )
        memory = self._memory(memory_src, origin_us, events, track_labels)
        counters = self._counters(origin_us)
        return Trace(events=events, memory=memory, counters=counters,
                     metadata=self._metadata(origin_us, records, events.num_rows, len(memory), len(counters)))

    # -- pieces ---------------------------------------------------------------------------------

    @staticmethod
    def _origin(ts: np.ndarray, memory: np.ndarray) -> float:
        """The earliest timestamp (µs) of the rows and memory records (metadata records are neither)."""
        candidates = [float(ts.min())] if len(ts) else []
        if len(memory):
            candidates.append(float(memory["ts"].min()))
        return min(candidates) if candidates else 0.0

    def _pair_begin_end(self, ph_codes, ph_values, pid, tid, flow_id, ts, dur, args):
        """Give each `B`/`b` the duration up to its `E`/`e` (args of both kept); drop the ends."""
        keep = np.ones(len(ts), dtype=bool)
        pairs = [(b, e) for b, e in (("B", "E"), ("b", "e")) if e in ph_values]
        if not pairs:
            return keep, dur, args
        dur = dur.copy()
        merged: dict[int, Any] = {}
        for begin, end in pairs:
            b_code = ph_values.index(begin) if begin in ph_values else -2
            e_code = ph_values.index(end)
            rows = np.flatnonzero((ph_codes == b_code) | (ph_codes == e_code))
            rows = rows[np.argsort(ts[rows], kind="stable")]
            stacks: dict[tuple[int, int], list[int]] = {}
            for row in rows.tolist():
                key = (int(pid[row]), int(flow_id[row] if begin == "b" else tid[row]))
                if ph_codes[row] == b_code:
                    stacks.setdefault(key, []).append(row)
                    continue
                keep[row] = False
                stack = stacks.get(key)
                if not stack:
                    self.skipped["end events without a begin"] += 1
                    continue
                opened = stack.pop()
                dur[opened] = ts[row] - ts[opened]
                end_args = args[row].as_py()
                if end_args:
                    merged[opened] = _merge_json(args[opened].as_py(), {"end_args": msgspec.json.decode(end_args)})
                self.skipped["end events (merged into their begin)"] += 1
        if merged:
            values = args.to_pylist()
            for row, text in merged.items():
                values[row] = text
            args = pa.chunked_array([pa.array(values, pa.string())])
        return keep, dur, args

    def _vendor(self, categories: list[str]) -> str:
        """Device prefix from the categories in use: rocm for AMD GPUs (Kineto reuses the cuda
        categories), mtia, xpu or cuda."""
        cats = {c for c in categories if c}
        if any(c.startswith("mtia") for c in cats):
            return "mtia"
        if any(c.startswith("xpu") for c in cats):
            return "xpu"
        names = " ".join(str(d.get("name", "")) for d in self.header.get("deviceProperties") or ())
        rocm = any(w in names for w in ("AMD", "Radeon", "Instinct")) or any(c.startswith("hip") for c in cats)
        return "rocm" if rocm else "cuda"

    def _tracks(self, device_code: np.ndarray, lane: np.ndarray, pid: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """Track code per row and the track labels (`cpu/thread T`, `cuda:0/stream 7`)."""
        host_pid = np.where(device_code < 0, pid, -1)
        keys = [factorize(k) for k in (device_code, lane, host_pid)]
        combined = (keys[0][0].astype(np.int64) * len(keys[1][1]) + keys[1][0]) * len(keys[2][1]) + keys[2][0]
        codes, unique = factorize(combined)
        pids = {p for p in keys[2][1].tolist() if p >= 0}
        labels = []
        for key in unique.tolist():
            key, p = divmod(key, len(keys[2][1]))
            d, ln = divmod(key, len(keys[1][1]))
            dev, lane_id, proc = (int(keys[0][1][d]), int(keys[1][1][ln]), int(keys[2][1][p]))
            if dev >= 0:
                labels.append(f"{self.vendor}:{dev}/stream {lane_id}")
            elif len(pids) > 1 and proc >= 0:
                labels.append(f"cpu/pid {proc}/thread {lane_id}")
            else:
                labels.append(f"cpu/thread {lane_id}")
        return codes, labels

    def _patch_args(self, args: pa.ChunkedArray, cat_codes: np.ndarray, cat_values: list[str],
                    kind: np.ndarray, ph_codes: np.ndarray, ph_values: list[str]) -> pa.ChunkedArray:
        """Merge into args what the schema has no column for: unknown categories and odd phases."""
        known = np.array([c in KIND_BY_CATEGORY for c in cat_values] + [True])[cat_codes]
        odd_ph = ~np.isin(ph_codes, [i for i, p in enumerate(ph_values) if p in _SPAN_PHASES])
        patch = np.flatnonzero(~known | odd_ph)
        if not len(patch):
            return args
        self.skipped["records of unknown category or phase (kept, kind other)"] += len(patch)
        values = args.to_pylist()
        for i in patch.tolist():
            extra: dict[str, Any] = {}
            if not known[i]:
                extra["cat"] = cat_values[cat_codes[i]]
            if odd_ph[i] and ph_values[ph_codes[i]]:  # an unknown phase is already in args
                extra["ph"] = ph_values[ph_codes[i]]
            values[i] = _merge_json(values[i], extra)
        kind[odd_ph] = KIND_CODES["other"]
        return pa.chunked_array([pa.array(values, pa.string())])
    def _memory(self, src: np.ndarray, origin_us: float, events: pa.Table, track_labels: list[str]) -> pa.Table:
        """The memory table from `[memory]` instants, each tied to the op running on its thread."""
        if not len(src):
            return schema.MEMORY.empty_table()
        codes, unique = _factorize_pairs(src["device_type"], src["device_id"])
        labels = []
        for dtype, index in unique:
            base = DEVICE_TYPES.get(dtype, "cpu" if dtype == MISSING else f"device{dtype}")
            if base == "cuda":
                base = self.vendor
            labels.append(base if base == "cpu" or index < 0 else f"{base}:{index}")
        device = codes
        ts_ns = np.rint((src["ts"] - origin_us) * 1000.0).astype(np.int64)
        delta = np.where(src["bytes"] == MISSING, 0, src["bytes"])
        allocated = src["allocated"].copy()
        if (allocated == MISSING).any():  # old traces lack totals: running sum of the deltas per device
            running = np.empty_like(delta)
            for d in np.unique(device):
                sel = np.flatnonzero(device == d)
                sel = sel[np.argsort(ts_ns[sel], kind="stable")]
                running[sel] = np.cumsum(delta[sel])
            allocated = np.where(allocated == MISSING, running, allocated)
        return pa.table(
            {
                "ts_ns": ts_ns,
                "device": dict_array(device, labels),
                "addr": np.where(src["addr"] == MISSING, -1, src["addr"]),
                "delta_bytes": delta,
                "allocated_bytes": allocated,
                "reserved_bytes": np.where(src["reserved"] == MISSING, -1, src["reserved"]),
                "event": self._enclosing_ops(src, ts_ns, events, track_labels),
            },
            schema=schema.MEMORY,
        )

    @staticmethod
    def _enclosing_ops(src: np.ndarray, ts_ns: np.ndarray, events: pa.Table, track_labels: list[str]) -> np.ndarray:
        """Row of the innermost op running on the allocating thread at each memory event."""
        code_of = {label: i for i, label in enumerate(track_labels)}
        multi = any(label.startswith("cpu/pid") for label in track_labels)
        which, threads = _factorize_pairs(src["pid"], src["tid"])
        thread_code = np.array([code_of.get(f"cpu/pid {p}/thread {t}" if multi else f"cpu/thread {t}", -1)
                                for p, t in threads], dtype=np.int64)
        q_track = thread_code[which]
        track = events["track"].combine_chunks().indices.to_numpy().astype(np.int64)
        kind = events["kind"].combine_chunks().indices.to_numpy()
        return innermost_enclosing(q_track, ts_ns, track, events["start_ns"].to_numpy(),
                                   events["dur_ns"].to_numpy(), events["parent"].to_numpy(),
                                   kind == KIND_CODES["op"])

    def _counters(self, origin_us: float) -> pa.Table:
        """One row per numeric series value of each `C` record (series `name.key`, or `name`)."""
        rows: list[tuple[int, str, float]] = []
        for chunk in self.chunks:
            for ts, name, values in chunk.counters:
                for key, value in values.items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        series = name if key == "value" else f"{name}.{key}"
                        rows.append((round((ts - origin_us) * 1000.0), series, float(value)))
                    else:
                        self.skipped["counter values that are not numbers"] += 1
        if not rows:
            return schema.COUNTERS.empty_table()
        ts_ns, names, values = zip(*rows, strict=True)
        return pa.table({"ts_ns": list(ts_ns), "device": pa.array(["cpu"] * len(rows)).dictionary_encode(),
                         "name": pa.array(list(names)).dictionary_encode(), "value": list(values)},
                        schema=schema.COUNTERS)

    def _metadata(self, origin_us: float, records: int, n_events: int, n_memory: int,
                  n_counters: int) -> dict[str, Any]:
        processes: dict[str, dict[str, Any]] = {}
        threads: dict[str, dict[str, Any]] = {}
        n_meta = 0
        for chunk in self.chunks:
            for name, pid, tid, values in chunk.meta:
                n_meta += 1
                value = next((values[k] for k in ("name", "labels", "sort_index") if k in values), values)
                if name.startswith("process_"):
                    processes.setdefault(str(pid), {})[name.removeprefix("process_")] = value
                elif name.startswith("thread_"):
                    threads.setdefault(f"{pid}/{tid}", {})[name.removeprefix("thread_")] = value
        self.skipped["metadata records (kept in metadata processes/threads)"] += n_meta
        header = {k: v for k, v in self.header.items() if k != "deviceProperties"}
        origin_ns = self.base_us * 1000 + round(origin_us * 1000)
        if isinstance(header.get("baseTimeNanoseconds"), int):
            origin_ns += header["baseTimeNanoseconds"]
        return {
            "source": {"format": "kineto", "file": str(self.path), "bytes": self.path.stat().st_size,
                       "header": header},
            "origin_ns": origin_ns,
            "devices": [_device_properties(d, self.vendor) for d in self.header.get("deviceProperties") or ()],
            "processes": processes,
            "threads": threads,
            "reader": {"records": records, "events": n_events, "memory": n_memory, "counters": n_counters,
                       "skipped": {k: v for k, v in self.skipped.items() if v}},
        }


def _to_ns(us: np.ndarray, origin_us: float) -> np.ndarray:
    """Integer ns from µs floats, rounded, with one temporary (the input is overwritten)."""
    us -= origin_us
    us *= 1000.0
    np.rint(us, out=us)
    return us.astype(np.int64)


def _factorize_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Codes of the distinct (a, b) pairs, and the pairs in code order."""
    a_codes, a_values = factorize(a)
    b_codes, b_values = factorize(b)
    codes, combined = factorize(a_codes.astype(np.int64) * len(b_values) + b_codes)
    pairs = [(int(a_values[k // len(b_values)]), int(b_values[k % len(b_values)])) for k in combined.tolist()]
    return codes, pairs


def _launchers(kind: np.ndarray, corr: np.ndarray, ext: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Row of the host op that launched each device event (-1 if unknown).

    Kernel → runtime call with the same correlation id → its innermost enclosing op (or, with no
    op around it, its innermost annotation such as a record_function range). Device events whose
    runtime call is not in the trace fall back to the op with the same External id.
    """
    launcher = np.full(len(kind), -1, dtype=np.int64)
    is_op = kind == KIND_CODES["op"]
    device = np.isin(kind, [KIND_CODES[k] for k in schema.DEVICE_KINDS])
    runtime = np.flatnonzero((kind == KIND_CODES["runtime"]) & (corr != MISSING))
    op_of_runtime = _enclosing(parent[runtime], parent, is_op)
    no_op = op_of_runtime < 0
    op_of_runtime[no_op] = _enclosing(parent[runtime[no_op]], parent, kind == KIND_CODES["annotation"])
    targets = np.flatnonzero(device & (corr != MISSING))
    launcher[targets] = lookup(corr[targets], corr[runtime], op_of_runtime)
    todo = np.flatnonzero(device & (launcher < 0) & (ext != MISSING))
    ops = np.flatnonzero(is_op & (ext != MISSING))
    launcher[todo] = lookup(ext[todo], ext[ops], ops)
    return launcher


def _enclosing(start: np.ndarray, parent: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """From each row in `start`, follow `parent` up to the first row where `wanted` holds (-1 if none)."""
    rows = start.copy()
    for _ in range(np.iinfo(np.int16).max):
        climb = (rows >= 0) & ~wanted[np.maximum(rows, 0)]
        if not climb.any():
            break
        rows[climb] = parent[rows[climb]]
    return rows


def _merge_json(text: str | None, extra: dict[str, Any]) -> str:
    base = msgspec.json.decode(text) if text else {}
    if not isinstance(base, dict):
        base = {"args": base}
    return msgspec.json.encode({**base, **extra}).decode()


def _device_properties(props: dict[str, Any], vendor: str) -> dict[str, Any]:
    """Kineto's deviceProperties entry in the workbench's device-metadata shape."""
    major = props.get("computeMajor")
    return {
        "device": f"{vendor}:{props.get('id', 0)}",
        "name": props.get("name"),
        "memory_bytes": props.get("totalGlobalMem"),
        "sm_count": props.get("numSms"),
        "compute_capability": None if major is None else f"{major}.{props.get('computeMinor')}",
        "source": props,
    }
