"""Reader for PyTorch CUDA memory snapshots (`torch.cuda.memory._snapshot()`, pickled), merged into a
trace's `memory` table so the memory views show the caching allocator's real addresses.

The format is torch's (`torch/cuda/memory.py: _snapshot` documents it; `torch/csrc/cuda/memory_snapshot.cpp`
writes it; `torch/cuda/_memory_viz.py` reads it):

    {"segments": [{"device", "address", "total_size", "allocated_size", "active_size", "stream",
                   "segment_type": "small"|"large", "segment_pool_id": (a, b), "is_expandable",
                   "frames", "blocks": [{"address", "size", "requested_size",
                                          "state": "active_allocated"|"active_pending_free"|"inactive",
                                          "frames"}]}],
     "device_traces": [[{"action", "addr", "size", "stream", "time_us", "frames"}, ...] per device],
     "allocator_settings": {...}}

with `action` one of alloc, free_requested, free_completed, segment_alloc, segment_free, segment_map,
segment_unmap (expandable segments), oom (`device_free` instead of `addr`) and snapshot; frames are
`{"filename", "line", "name"}`. `time_us` is microseconds since the Unix epoch (the allocator's TSC
clock converted by c10's ApproximateClockToUnixTimeConverter).

What goes where:

| source                              | goes to                                                               |
|-------------------------------------|-----------------------------------------------------------------------|
| alloc / free_completed              | `memory`: +size / -size at `addr` (a free counts once the memory is   |
|                                     | reusable, as `_memory_viz` counts it)                                 |
| segment_alloc, _map / _free, _unmap | `memory`: delta 0 at the segment's address, `reserved_bytes` changes  |
| every trace entry, frames included  | `cuda_allocator` table (frames as JSON, `memory_row` links the rows)  |
| segment lifetimes, final segments   | `cuda_segments` table: address ranges over time, for the memory map   |

`allocated_bytes` counts requested sizes (what the trace entries carry), `reserved_bytes` segment
sizes; both are absolute: the totals at the snapshot (its segments and blocks) minus the changes the
history recorded give the totals when the history begins.

Alignment: a trace's origin in Unix-epoch ns is `origin_ns` for Kineto traces (torch.profiler writes
epoch-based times) and the session's `utcEpochNs` plus `origin_ns` for Nsight Systems exports (their
times count from the session start); the snapshot's times are shifted by it, to within the clocks'
microsecond resolution. `merge_cuda_memory` keeps only records inside the trace's time range (the
ones before it are in the totals anyway) and ties each to the op running on the host thread that
allocates in the trace.
"""

from __future__ import annotations

import io
import json
import os
import pickle
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from workbench.errors import TraceFormatError, WorkbenchError
from workbench.trace import schema
from workbench.trace.columns import dict_array, encode_strings
from workbench.trace.model import Trace
from workbench.trace.nesting import innermost_enclosing

SNAPSHOT_SUFFIX = ".cuda-memory.pickle"
"""File name suffix of the snapshots the workbench records (in a bundle's raw/)."""

ALLOC, FREE_COMPLETED = "alloc", "free_completed"
SEGMENT_GROW = ("segment_alloc", "segment_map")
SEGMENT_SHRINK = ("segment_free", "segment_unmap")
ALLOCATED_STATES = ("active_allocated", "active_pending_free")
"""Block states still counted as allocated (a pending free is not reusable yet)."""

ALLOCATOR = pa.schema([
    ("ts_ns", pa.int64()),
    ("device", pa.dictionary(pa.int32(), pa.string())),
    ("action", pa.dictionary(pa.int32(), pa.string())),
    ("addr", pa.int64()),
    ("size", pa.int64()),
    ("stream", pa.int64()),
    ("frames", pa.string()),
    ("memory_row", pa.int64()),
])
"""`cuda_allocator`: every allocator trace entry; `frames` is a JSON list, `memory_row` the `memory` row (-1)."""

SEGMENTS = pa.schema([
    ("device", pa.dictionary(pa.int32(), pa.string())),
    ("addr", pa.int64()),
    ("size", pa.int64()),
    ("alloc_ns", pa.int64()),
    ("free_ns", pa.int64()),
    ("stream", pa.int64()),
    ("segment_type", pa.string()),
    ("pool", pa.string()),
    ("expandable", pa.bool_()),
    ("allocated_bytes", pa.int64()),
    ("frames", pa.string()),
])
"""`cuda_segments`: one row per segment; `alloc_ns` -1 when made before the history (or trace) began,
`free_ns` -1 when still reserved at its end; `allocated_bytes` at the snapshot (-1 once freed)."""

TABLE_NAMES = ("cuda_allocator", "cuda_segments")
"""Names of the extra bundle tables `with_cuda_snapshot` returns."""


@dataclass(frozen=True)
class CudaMemory:
    """A snapshot read into tables: `memory` (the Trace schema), `allocator` and `segments` (above)."""

    memory: pa.Table
    allocator: pa.Table
    segments: pa.Table
    metadata: dict[str, Any] = field(default_factory=dict)


class _SafeUnpickler(pickle.Unpickler):
    """Unpickles plain data only: a snapshot is dicts, lists, tuples, strings and numbers."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a memory snapshot holds plain data only")


def load_snapshot(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The snapshot dict in a pickle written by `torch.cuda.memory._dump_snapshot` (or pickle.dump of
    `_snapshot()`), refusing pickles that would construct objects."""
    path = Path(path)
    try:
        data = _SafeUnpickler(io.BytesIO(path.read_bytes())).load()
    except OSError as exc:
        raise TraceFormatError(path, f"cannot read: {exc.strerror}") from exc
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
        raise TraceFormatError(path, f"not a CUDA memory snapshot pickle: {exc}") from exc
    if not isinstance(data, dict) or "segments" not in data or "device_traces" not in data:
        raise TraceFormatError(path, "not a CUDA memory snapshot: expected a dict with segments and device_traces")
    return data


def read_cuda_snapshot(snapshot: Mapping[str, Any] | str | os.PathLike[str], epoch_origin_ns: int = 0,
                       device_prefix: str = "cuda") -> CudaMemory:
    """The tables of a snapshot (a dict, or the path of its pickle), times in ns after `epoch_origin_ns`
    (Unix-epoch ns; 0 keeps epoch times). Devices are named `<device_prefix>:<index>`."""
    source = "<snapshot>"
    if not isinstance(snapshot, Mapping):
        source = str(snapshot)
        snapshot = load_snapshot(snapshot)
    traces = snapshot.get("device_traces")
    segments = snapshot.get("segments")
    if not isinstance(traces, Sequence) or not isinstance(segments, Sequence):
        raise TraceFormatError(source, "not a CUDA memory snapshot: expected lists under segments and device_traces")
    skipped: Counter[str] = Counter()
    entries = [(index, entry) for index, trace in enumerate(traces) for entry in (trace or ())]
    missing_time = sum(1 for _, entry in entries if "time_us" not in entry)
    if missing_time:
        raise TraceFormatError(source, f"{missing_time} allocator trace entries have no time_us (snapshots "
                                       "of torch < 2.1): they cannot be placed in time")
    entries.sort(key=lambda item: (item[0], item[1]["time_us"]))  # stable: same-time entries keep their order
    labels = [f"{device_prefix}:{index}" for index in range(max(len(traces), 1 + _max_device(segments)))]
    memory, memory_rows = _memory(entries, segments, labels, epoch_origin_ns, skipped)
    allocator = _allocator(entries, labels, epoch_origin_ns, memory_rows)
    metadata = {
        "source": source,
        "entries": len(entries),
        "actions": dict(Counter(str(entry.get("action")) for _, entry in entries)),
        "segments_at_snapshot": len(segments),
        "allocator_settings": snapshot.get("allocator_settings"),
        "skipped": dict(skipped),
    }
    return CudaMemory(memory, allocator, _segments(entries, segments, labels, epoch_origin_ns), metadata)


def _max_device(segments: Sequence[Mapping[str, Any]]) -> int:
    return max((int(seg.get("device", 0)) for seg in segments), default=-1)


def _memory(entries: list[tuple[int, Mapping[str, Any]]], segments: Sequence[Mapping[str, Any]], labels: list[str],
            epoch_origin_ns: int, skipped: Counter[str]) -> tuple[pa.Table, np.ndarray]:
    """The memory rows, and for each trace entry its memory row (-1 for actions that make none)."""
    allocated_end = np.zeros(len(labels), dtype=np.int64)
    reserved_end = np.zeros(len(labels), dtype=np.int64)
    for seg in segments:
        d = int(seg.get("device", 0))
        reserved_end[d] += int(seg.get("total_size", 0))
        for block in seg.get("blocks") or ():
            if block.get("state") in ALLOCATED_STATES:
                allocated_end[d] += int(block.get("requested_size", block.get("size", 0)))
    rows = []
    memory_rows = np.full(len(entries), -1, dtype=np.int64)
    for i, (d, entry) in enumerate(entries):
        action, size = entry.get("action"), int(entry.get("size", 0))
        if action == ALLOC:
            delta, reserve = size, 0
        elif action == FREE_COMPLETED:
            delta, reserve = -size, 0
        elif action in SEGMENT_GROW:
            delta, reserve = 0, size
        elif action in SEGMENT_SHRINK:
            delta, reserve = 0, -size
        else:
            skipped[f"{action} entries (kept in cuda_allocator, no memory change)"] += 1
            continue
        memory_rows[i] = len(rows)
        rows.append((d, round(entry["time_us"] * 1000) - epoch_origin_ns, int(entry.get("addr", -1)), delta, reserve))
    if not rows:
        return schema.MEMORY.empty_table(), memory_rows
    device, ts, addr, delta, reserve = (np.array(column, dtype=np.int64) for column in zip(*rows, strict=True))
    allocated = np.empty_like(delta)
    reserved = np.empty_like(reserve)
    for d in np.unique(device):
        sel = device == d  # rows are in time order per device already
        allocated[sel] = allocated_end[d] - delta[sel].sum() + np.cumsum(delta[sel])
        reserved[sel] = reserved_end[d] - reserve[sel].sum() + np.cumsum(reserve[sel])
    table = pa.table({
        "ts_ns": ts, "device": dict_array(device, labels), "addr": addr, "delta_bytes": delta,
        "allocated_bytes": allocated, "reserved_bytes": reserved, "event": np.full(len(ts), -1, dtype=np.int64),
    }, schema=schema.MEMORY)
    return table, memory_rows


def _frames(frames: Any) -> str | None:
    """Frames as compact JSON, or None when there are none."""
    return json.dumps(list(frames), separators=(",", ":"), default=str) if frames else None


def _allocator(entries: list[tuple[int, Mapping[str, Any]]], labels: list[str], epoch_origin_ns: int,
               memory_rows: np.ndarray) -> pa.Table:
    """The `cuda_allocator` table: one row per trace entry."""
    actions, action_names = encode_strings([str(entry.get("action")) for _, entry in entries])
    return pa.table({
        "ts_ns": np.array([round(e["time_us"] * 1000) - epoch_origin_ns for _, e in entries], dtype=np.int64),
        "device": dict_array(np.array([d for d, _ in entries], dtype=np.int32), labels),
        "action": dict_array(actions, action_names),
        "addr": np.array([int(e.get("addr", -1)) for _, e in entries], dtype=np.int64),
        "size": np.array([int(e.get("size", 0)) for _, e in entries], dtype=np.int64),
        "stream": np.array([int(e.get("stream", 0)) for _, e in entries], dtype=np.int64),
        "frames": pa.array([_frames(e.get("frames")) for _, e in entries], pa.string()),
        "memory_row": memory_rows,
    }, schema=ALLOCATOR)


def _segments(entries: list[tuple[int, Mapping[str, Any]]], segments: Sequence[Mapping[str, Any]],
              labels: list[str], epoch_origin_ns: int) -> pa.Table:
    """The `cuda_segments` table: segments the history made (and freed), then those alive at the snapshot
    that the history did not make (alloc_ns -1)."""
    open_at: dict[tuple[int, int], dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    for d, entry in entries:
        action, addr = entry.get("action"), int(entry.get("addr", -1))
        ts = round(entry["time_us"] * 1000) - epoch_origin_ns
        if action in SEGMENT_GROW:
            row = {"device": d, "addr": addr, "size": int(entry.get("size", 0)), "alloc_ns": ts, "free_ns": -1,
                   "stream": int(entry.get("stream", 0)), "segment_type": None, "pool": None, "expandable": None,
                   "allocated_bytes": -1, "frames": _frames(entry.get("frames"))}
            rows.append(row)
            open_at[(d, addr)] = row
        elif action in SEGMENT_SHRINK:
            row = open_at.pop((d, addr), None)
            if row is None:  # made before the history began
                row = {"device": d, "addr": addr, "size": int(entry.get("size", 0)), "alloc_ns": -1,
                       "stream": int(entry.get("stream", 0)), "segment_type": None, "pool": None,
                       "expandable": None, "allocated_bytes": -1, "frames": None}
                rows.append(row)
            row["free_ns"] = ts
    for seg in segments:
        d, addr = int(seg.get("device", 0)), int(seg.get("address", -1))
        row = open_at.pop((d, addr), None)
        if row is None:
            row = {"device": d, "addr": addr, "size": int(seg.get("total_size", 0)), "alloc_ns": -1, "free_ns": -1,
                   "stream": int(seg.get("stream", 0)), "frames": _frames(seg.get("frames"))}
            rows.append(row)
        pool = seg.get("segment_pool_id")
        row.update(segment_type=seg.get("segment_type"), expandable=seg.get("is_expandable"),
                   pool=",".join(map(str, pool)) if isinstance(pool, (list, tuple)) else None,
                   allocated_bytes=int(seg.get("allocated_size", 0)))
    if not rows:
        return SEGMENTS.empty_table()
    columns = {name: [row.get(name) for row in rows] for name in SEGMENTS.names}
    columns["device"] = dict_array(np.array(columns["device"], dtype=np.int32), labels)
    return pa.table(columns, schema=SEGMENTS)


def trace_epoch_ns(trace: Trace) -> int:
    """The Unix-epoch time (ns) of the trace's origin, from its metadata; raises when the format has none."""
    meta = trace.metadata
    fmt = (meta.get("source") or {}).get("format")
    origin = meta.get("origin_ns")
    if fmt == "kineto" and isinstance(origin, int):
        return origin
    session = meta.get("session") or {}
    if fmt == "nsys" and isinstance(origin, int) and isinstance(session.get("utcEpochNs"), int):
        return session["utcEpochNs"] + origin
    raise WorkbenchError(f"cannot place a CUDA memory snapshot on a {fmt or 'unknown'} trace: "
                         "its metadata gives no Unix-epoch origin")


def merge_cuda_memory(trace: Trace, cuda: CudaMemory) -> Trace:
    """`trace` with its memory rows of the snapshot's devices replaced by the snapshot's rows inside the
    trace's time range, each tied to the op running then on the host thread that allocates (see the
    module docstring); `metadata["cuda_snapshot"]` says what was replaced and left out."""
    memory = cuda.memory
    labels = memory["device"].combine_chunks().dictionary_decode().to_pylist() if memory.num_rows else []
    devices = set(labels)
    old = trace.memory
    old_devices = old["device"].combine_chunks().dictionary_decode().to_pylist() if old.num_rows else []
    replaced = np.array([d in devices for d in old_devices], dtype=bool)
    end = _trace_end(trace)
    ts = memory["ts_ns"].to_numpy()
    inside = (ts >= 0) & (ts <= end)
    memory = memory.filter(pa.array(inside))
    memory = memory.set_column(memory.schema.get_field_index("event"), "event",
                               pa.array(_enclosing_ops(trace, old, replaced, memory["ts_ns"].to_numpy())))
    kept = old.filter(pa.array(~replaced)) if old.num_rows else old
    merged = pa.concat_tables([kept.cast(schema.MEMORY), memory.cast(schema.MEMORY)]).unify_dictionaries()
    merged = merged.combine_chunks().take(pa.array(np.argsort(merged["ts_ns"].to_numpy(), kind="stable")))
    metadata = dict(trace.metadata)
    metadata["cuda_snapshot"] = {**cuda.metadata, "devices": sorted(devices), "replaced_rows": int(replaced.sum()),
                                 "rows": int(inside.sum()), "outside_trace": int((~inside).sum())}
    return Trace(events=trace.events, memory=merged, counters=trace.counters, metadata=metadata)


def with_cuda_snapshot(trace: Trace, path: str | os.PathLike[str] | None) -> tuple[Trace, dict[str, pa.Table]]:
    """`trace` with the snapshot at `path` merged (see `merge_cuda_memory`) and the extra bundle tables
    (`cuda_allocator`, `cuda_segments`); unchanged and no tables when `path` is None."""
    if path is None:
        return trace, {}
    cuda = read_cuda_snapshot(path, trace_epoch_ns(trace), _device_prefix(trace))
    return merge_cuda_memory(trace, cuda), dict(zip(TABLE_NAMES, (cuda.allocator, cuda.segments), strict=True))


def _device_prefix(trace: Trace) -> str:
    """`rocm` for traces of AMD GPUs (torch.cuda is HIP there), else `cuda`."""
    names = trace.events["device"].combine_chunks().dictionary.to_pylist() if trace.events.num_rows else []
    return "rocm" if any(str(name).startswith("rocm") for name in names) else "cuda"


def _trace_end(trace: Trace) -> int:
    """The end of the trace's last event (ns from its origin)."""
    events = trace.events
    if not events.num_rows:
        return 0
    return int((events["start_ns"].to_numpy() + events["dur_ns"].to_numpy()).max())


def _enclosing_ops(trace: Trace, old: pa.Table, replaced: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """For each time, the innermost op on the allocating thread: the track whose ops the replaced rows
    were tied to most often, else the track with the most ops."""
    events = trace.events
    if not events.num_rows or not len(ts):
        return np.full(len(ts), -1, dtype=np.int64)
    track = events["track"].combine_chunks().indices.to_numpy(zero_copy_only=False).astype(np.int64)
    kind = events["kind"].combine_chunks().dictionary_decode().to_numpy(zero_copy_only=False)
    is_op = kind == "op"
    if not is_op.any():
        return np.full(len(ts), -1, dtype=np.int64)
    tied = old["event"].to_numpy()[replaced] if old.num_rows else np.zeros(0, np.int64)
    tied = tied[tied >= 0]
    counts = np.bincount(track[tied] if len(tied) else track[is_op])
    thread = int(np.argmax(counts))
    return innermost_enclosing(np.full(len(ts), thread, dtype=np.int64), ts, track, events["start_ns"].to_numpy(),
                               events["dur_ns"].to_numpy(), events["parent"].to_numpy(), is_op)
