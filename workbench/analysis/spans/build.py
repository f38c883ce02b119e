"""Building a run's span index from its events.parquet: the events in (lane, start) order and the per-lane
structures that make a timeline query a few binary searches (`workbench.analysis.spans.index` holds them and
answers the queries; `workbench.analysis.spans.mapped` keeps them on disk).

Only the columns the timeline needs are read (never shapes' text twice, args or dtypes, which dominate a
big trace), one at a time: each is put in index order and its Arrow buffers dropped, so the peak stays near
the index. What is built:

- the order: `row[pos]` is the row in events.parquet of the event at position `pos`, `position` its
  inverse; every per-event array is in that order, lane by lane (`lane_start`), by start then row;
- overlap: per lane, the few longest events (at most `LONG_PER_LANE`) are kept aside (`long`); the others
  are at most `short_max[lane]` long, so an event overlapping [s, e) starts within [s - short_max, e);
- busy time: per lane, the union of its work intervals (annotations and step markers excluded unless the
  lane holds nothing else, as `workbench.analysis.timeline.density`) with the covered time before each;
- longest event: `block_key[b]`, the largest `longest_keys` of positions `b·BLOCK` to `(b + 1)·BLOCK`.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from workbench.analysis.timeline import PHASE_NAMES, STEP_NAME, lane_of_rows, lanes_of
from workbench.errors import BundleError

INDEX_VERSION = 3
"""What `build` computes, versioned: an index file of another version is built again (3: device lanes first)."""
INDEX_COLUMNS = ("start_ns", "dur_ns", "name", "kind", "device", "track", "parent", "depth", "launcher", "flops",
                 "shapes")
"""The events columns an index reads."""
LONG_PER_LANE = 1024
"""Longest events per lane kept aside from the binary-searched ones (see the module docstring)."""
BLOCK = 32
"""Events per block of the precomputed longest-event keys (see `SpanIndex.longest`)."""


def build(path: Path) -> dict[str, Any]:
    """The fields of the span index of the events table at `path` (a bundle's events.parquet), `SpanIndex`'s
    but its path. Raises BundleError naming the file when it cannot be read or lacks a column."""
    try:
        # shapes, a plain string column, read as a dictionary: its many repeats then cost 4 bytes each
        events = pq.ParquetFile(path, memory_map=True, read_dictionary=["shapes"])
        missing = sorted(set(INDEX_COLUMNS) - set(events.schema_arrow.names))
        if missing:
            raise BundleError(f"{path}: the events table lacks the column(s) {', '.join(missing)}")
        fields = _build(events)
    except (OSError, pa.ArrowException) as exc:
        raise BundleError(f"{path}: cannot read the events table: {exc}") from exc
    pa.default_memory_pool().release_unused()  # the columns read are copied into the index: give them back
    return fields


def _build(events: pq.ParquetFile) -> dict[str, Any]:
    def read(*columns: str) -> pa.Table:
        return events.read(columns=list(columns)).unify_dictionaries().combine_chunks()

    placed = read("track", "device", "depth")
    lane_table = lanes_of(placed)
    lane = lane_of_rows(placed, lane_table)
    del placed
    start = read("start_ns")["start_ns"].to_numpy()
    order = _lane_start_order(lane, start)
    n = len(order)
    small = np.int32 if n < 2**31 else np.int64
    order = order.astype(small)
    position = np.empty(n, dtype=small)
    position[order] = np.arange(n, dtype=small)
    lane_start = np.searchsorted(lane[order], np.arange(len(lane_table) + 1)).astype(np.int64)
    del lane
    start = start[order]

    def ordered(column: str, dtype: type) -> np.ndarray:
        return read(column)[column].to_numpy()[order].astype(dtype, copy=False)

    dur = ordered("dur_ns", np.int64)
    launcher = ordered("launcher", small)
    linked = launcher[(launcher >= 0) & (launcher < n)]
    launched = np.bincount(linked, minlength=n)[order].astype(np.int32)
    del linked
    names, name = _dictionary(read("name")["name"])
    kinds, kind = _dictionary(read("kind")["kind"])
    name, kind = name[order], kind[order].astype(np.int8)
    shape_values, shapes = _dictionary(read("shapes")["shapes"])
    shapes = shapes[order]
    marker = np.array([n in PHASE_NAMES or STEP_NAME.fullmatch(n) is not None for n in names], dtype=bool)
    is_marker = marker[name] | (kind == _code(kinds, "annotation"))
    long, short_max = _long_events(dur, lane_start)
    busy = busy_union(start, dur, is_marker, lane_start)
    block_key = np.r_[np.maximum.reduceat(longest_keys(is_marker, dur, np.arange(n)), np.arange(0, n, BLOCK))
                      if n else np.zeros(0, np.int64), -1]
    extent = (int(start.min()), int(np.maximum(start + dur, start + 1).max())) if n else (0, 0)
    return dict(lanes=lane_table, row=order, position=position, start=start, dur=dur, name=name, kind=kind,
                depth=ordered("depth", np.int16), launcher=launcher, parent=ordered("parent", small),
                flops=ordered("flops", np.float32), launched=launched, shapes=shapes, names=names, kinds=kinds,
                shape_values=shape_values, marker=marker, is_marker=is_marker, lane_start=lane_start, long=long,
                short_max=short_max, block_key=block_key, extent=extent, **busy)


def longest_keys(is_marker: np.ndarray, dur: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Keys ranking the events at `positions` by duration, markers below any work: the rank (duration + 1, 0
    for a marker, capped) above the reversed position, so the largest key is the longest event and, among
    equals, the first; the position is `mask - (key & mask)` with `mask` covering the run's positions."""
    bits = max(len(dur).bit_length(), 1)
    rank = np.where(is_marker[positions], 0, np.minimum(dur[positions], (1 << (62 - bits)) - 2) + 1)
    return (rank << bits) | (((1 << bits) - 1) - positions.astype(np.int64))


def key_positions(keys: np.ndarray, size: int) -> np.ndarray:
    """The positions that `longest_keys` keys stand for, in a run of `size` events."""
    mask = (1 << max(size.bit_length(), 1)) - 1
    return mask - (keys & mask)


def _lane_start_order(lane: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Row order by (lane, start, row). One stable sort of a combined key when it fits int64 (readers
    write tracks in start order, so timsort meets long sorted runs), else a lexsort."""
    if not len(start):
        return np.zeros(0, dtype=np.int64)
    origin, span = int(start.min()), int(start.max()) - int(start.min()) + 1
    if (int(lane.max()) + 1) * span < 2**62:
        return np.argsort(lane.astype(np.int64) * span + (start - origin), kind="stable")
    return np.lexsort((start, lane))


def _long_events(dur: np.ndarray, lane_start: np.ndarray) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """Per lane, the positions of its (at most LONG_PER_LANE) longest events and the longest duration of
    the others."""
    long, short_max = [], np.zeros(len(lane_start) - 1, dtype=np.int64)
    for lane, (lo, hi) in enumerate(itertools.pairwise(lane_start)):
        lane_dur = dur[lo:hi]
        if len(lane_dur) <= LONG_PER_LANE:
            long.append(np.arange(lo, hi))
            continue
        limit = int(np.partition(lane_dur, len(lane_dur) - LONG_PER_LANE - 1)[len(lane_dur) - LONG_PER_LANE - 1])
        long.append(lo + np.flatnonzero(lane_dur > limit))
        short_max[lane] = limit
    return tuple(long), short_max


def busy_union(start: np.ndarray, dur: np.ndarray, is_marker: np.ndarray,
                lane_start: np.ndarray) -> dict[str, np.ndarray]:
    """Each lane's union of work intervals and the covered time before each interval of the union. Events
    are in (lane, start) order already, so a lane's union is one running maximum of the ends over its
    slice; an event that is no work (a marker, unless its lane holds nothing else) ends where it starts,
    so it adds no time and nothing is gathered."""
    n_lanes = len(lane_start) - 1
    counts = np.diff(lane_start)
    # markers per lane by the lane of each event (a reduceat would fail on a lane without events at the end)
    lane_of_marker = np.bincount(np.repeat(np.arange(n_lanes), counts), weights=is_marker, minlength=n_lanes)
    marker_lanes = (lane_of_marker == counts) & (counts > 0)
    no_work = is_marker & np.repeat(~marker_lanes, counts) if marker_lanes.any() else is_marker
    end = start + np.where(no_work, 0, dur)
    del no_work
    starts, ends = [], []
    for lo, hi in itertools.pairwise(lane_start.tolist()):
        s, e = start[lo:hi], end[lo:hi]
        if hi > lo:
            reach = np.maximum.accumulate(e)
            first = np.flatnonzero(np.r_[True, s[1:] > reach[:-1]])
            s, e = s[first], np.maximum.reduceat(e, first)
            kept = e > s
            s, e = s[kept], e[kept]
        starts.append(s)
        ends.append(e)
    offsets = np.r_[0, np.cumsum([len(s) for s in starts])].astype(np.int64)
    busy_start = np.concatenate(starts) if starts else np.zeros(0, np.int64)
    busy_end = np.concatenate(ends) if ends else np.zeros(0, np.int64)
    lengths = busy_end - busy_start
    covered = np.cumsum(lengths) - lengths
    lane_first = covered[np.minimum(offsets[:-1], len(covered) - 1)] if len(covered) else np.zeros(n_lanes, np.int64)
    before = covered - np.repeat(lane_first, np.diff(offsets))  # an empty lane repeats its (any) value 0 times
    return {"busy_offset": offsets, "busy_start": busy_start, "busy_end": busy_end, "busy_before": before}


def covered_ns(busy_start: np.ndarray, busy_end: np.ndarray, busy_before: np.ndarray,
               edges: np.ndarray) -> np.ndarray:
    """Work time of one union of intervals (`busy_union`'s arrays for one lane) covered between consecutive
    `edges` (sorted ns; float ns out)."""
    if not len(busy_start):
        return np.zeros(len(edges) - 1)
    at = np.searchsorted(busy_start, edges, side="right") - 1
    inside = at >= 0
    idx = np.maximum(at, 0)
    covered = np.where(inside, busy_before[idx] + np.clip(edges - busy_start[idx], 0, busy_end[idx] - busy_start[idx]),
                       0)
    return np.diff(covered.astype(np.float64))


def _code(dictionary: np.ndarray, value: str) -> int:
    """The code of `value` in `dictionary` (-1 when absent: it then matches no code)."""
    hits = np.flatnonzero(dictionary == value)
    return int(hits[0]) if len(hits) else -1


def _dictionary(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """A dictionary column of one chunk as (dictionary as an object array, its integer codes); a null gets the
    code of an empty string added at the end of the dictionary."""
    array = column.chunk(0) if column.num_chunks else pa.array([], type=column.type)
    values = array.dictionary.to_pylist()
    indices = array.indices
    if array.null_count:
        indices = pc.fill_null(indices, len(values))
        values.append("")
    return np.asarray(values, dtype=object), indices.to_numpy(zero_copy_only=False)
