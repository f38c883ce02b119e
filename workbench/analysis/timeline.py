"""What the op timeline draws: lanes, the real spans of a time window, and multi-resolution density.

Pure functions over a `Trace` (no plotting). They read the Arrow columns as numpy arrays and never
build per-event Python objects, so they scale to traces of ten million events.

Level of detail: `density` cuts the trace's time range into `bins` equal bins at level 0 and twice
as many at each further level. Per lane and bin it stores the number of events starting there (so
counts add up to the lane's events at every level), the number of events overlapping it (what a bar
drawn busy is made of, though every one may have started earlier), the busy fraction (the union of the lane's span
time inside the bin over the bin width) and the dominant kind and name (most span time in the bin).
A view shows real spans while its visible window holds at most a budget of them (`detail_window`
finds such a window) and otherwise the density level whose bins are no wider than a pixel
(`select_level`): a span narrower than a pixel cannot be drawn as itself anyway.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from workbench.analysis.timeline_bins import overlapping_counts, spread, union_intervals
from workbench.trace import Trace
from workbench.trace.schema import LIFECYCLE_PHASES

STEP_NAME = re.compile(r"(ProfilerStep#\d+|step[ #_]?\d+)", re.IGNORECASE)
"""Annotation names that mark one iteration (torch.profiler's and the workbench's own)."""

PHASE_NAMES = frozenset(LIFECYCLE_PHASES)
"""Annotation names of the workbench's lifecycle phases (`workbench.trace.schema.LIFECYCLE_PHASES`)."""

SPAN_COLUMNS = ("row", "lane", "depth", "start_ns", "end_ns", "dur_ns", "name", "kind", "shapes", "flops",
                "launcher", "launched")
"""Columns of `spans`, in order."""

LANE_COLUMNS = ("lane", "device", "track", "label", "events", "max_depth", "tracks")
"""Columns of `lanes`, in order."""

MAX_LANES = 64
"""Lanes a timeline draws at most by default; past it the quietest tracks fold (`fold_lanes`)."""
FOLDED_TRACK = "{device}/…more"
"""`track` of a device's folded lane (no reader names a track so)."""
OTHER_DEVICES = "other devices"
"""`device` of the lane holding the quietest devices' tracks, when a trace has too many devices for a lane each."""

DENSITY_COLUMNS = ("level", "lane", "bin", "start_ns", "end_ns", "busy", "count", "overlap", "kind", "name")
"""Columns of `Density.cells`, in order."""

_START_WEIGHT = 1e-3
"""Weight (in ns of span time) of an event starting in a bin when ranking a bin's names: it only
breaks ties and names bins that hold no span time (instants, or annotations alone)."""


@dataclass(frozen=True)
class Density:
    """Multi-resolution density of a trace: level `l` cuts [origin_ns, origin_ns + span_ns) into `bins[l]` bins.

    `cells` has one row per (level, lane, bin) holding an event start or span time; `busy` in [0, 1].
    """

    origin_ns: int
    span_ns: int
    bins: tuple[int, ...]
    cells: pd.DataFrame

    def bin_ns(self, level: int) -> float:
        """Width of one bin at `level`, in ns."""
        return self.span_ns / self.bins[level]


def lanes(trace: Trace, max_lanes: int = MAX_LANES) -> pd.DataFrame:
    """One row per lane, in drawing order: a track, or a group of quiet tracks folded into one lane.

    | lane | device | track | label | events | max_depth | tracks |

    Devices come accelerators first, by type and index (cuda:0, cuda:1, ..., tpu:0), then the CPU: the
    device work a timeline is read for sits at the top, above the host threads that launch it. Within
    the CPU, threads are ordered by activity (most events first); within a device, by the number in
    the track (stream 7 before stream 20). `label` is the track without its device prefix. Past
    `max_lanes` tracks, the quietest fold (`fold_lanes`): what a view draws stays bounded by what fits
    on a screen, not by how many threads a trace names. `tracks` counts the tracks in the lane.
    """
    return lanes_of(trace.events, max_lanes)


def lanes_of(events: pa.Table, max_lanes: int = MAX_LANES) -> pd.DataFrame:
    """`lanes` from an events table holding at least the `track`, `device` and `depth` columns (the span
    index reads only the columns it needs from a bundle)."""
    return fold_lanes(track_table(events), max_lanes)


def track_table(events: pa.Table) -> pd.DataFrame:
    """One row per track, in drawing order (see `lanes`): | device | track | label | events | max_depth |."""
    track_codes, track_names = dictionary_codes(events["track"])
    device_codes, device_names = dictionary_codes(events["device"])
    depth = _numpy(events["depth"])
    # per track code: counts, first row and deepest depth, without sorting the rows (ten million of them)
    counts = np.bincount(track_codes, minlength=len(track_names))
    present = np.flatnonzero(counts)
    first_row = first_rows(track_codes, len(track_names))
    max_depth = np.full(len(track_names), np.iinfo(depth.dtype).min, dtype=depth.dtype)
    np.maximum.at(max_depth, track_codes, depth)
    table = pd.DataFrame({  # strings kept as objects: numpy's str dtype drops a name's trailing NUL characters
        "device": [str(name) for name in device_names[device_codes[first_row[present]]]],
        "track": [str(name) for name in track_names[present]],
        "events": counts[present].astype(np.int64),
        "max_depth": max_depth[present].astype(np.int64),
    })
    pairs = zip(table["track"], table["device"], strict=True)
    table["label"] = [strip_device(track, device) for track, device in pairs]
    keys = [_lane_key(device, label, events) for device, label, events
            in zip(table["device"], table["label"], table["events"], strict=True)]
    order = sorted(range(len(table)), key=keys.__getitem__)
    return table.iloc[order].reset_index(drop=True)[["device", "track", "label", "events", "max_depth"]]


def fold_lanes(tracks: pd.DataFrame, max_lanes: int = MAX_LANES) -> pd.DataFrame:
    """The lanes of a `track_table`: each track its own lane while they number at most `max_lanes`, else
    the quietest fold into one lane per device (`FOLDED_TRACK`, "N more threads") and, past `max_lanes // 2`
    devices, the quietest devices into one `OTHER_DEVICES` lane. Each device gets a share of the lanes
    (the busiest devices' tracks first, then evenly), keeping its busiest tracks in drawing order."""
    if len(tracks) <= max_lanes:
        return _numbered(tracks.assign(tracks=np.ones(len(tracks), dtype=np.int64)))
    device_events = tracks.groupby("device", sort=False)["events"].sum()
    busiest = device_events.sort_values(ascending=False, kind="stable")
    kept_devices = busiest.index[:max(max_lanes // 2 - 1, 1)] if len(busiest) > max_lanes // 2 else busiest.index
    kept = tracks[tracks["device"].isin(kept_devices)]
    budget = max_lanes - (len(kept) < len(tracks))
    quota = _lane_quota(kept.groupby("device", sort=False).size(), budget)
    parts = []
    for device, group in kept.groupby("device", sort=False):
        share = int(quota[device])
        if len(group) <= share:
            parts.append(group.assign(tracks=1))
            continue
        busy = group.sort_values("events", ascending=False, kind="stable").index[:share - 1]
        folded = group.drop(index=busy)
        parts.append(group.loc[sorted(busy)].assign(tracks=1))
        parts.append(_folded(folded, device, FOLDED_TRACK.format(device=device),
                             f"{len(folded):,} more {_track_noun(folded)}"))
    others = tracks[~tracks["device"].isin(kept_devices)]
    if len(others):
        parts.append(_folded(others, OTHER_DEVICES, FOLDED_TRACK.format(device=OTHER_DEVICES),
                             f"{others['device'].nunique():,} more devices"))
    return _numbered(pd.concat(parts, ignore_index=True))


def lane_of_rows(events: pa.Table, lane_table: pd.DataFrame) -> np.ndarray:
    """The lane of every event row (int32), given the `lanes` table of the same events: a track of its own
    lane, else its device's folded lane, else the `OTHER_DEVICES` lane."""
    track_codes, track_names = dictionary_codes(events["track"])
    device_codes, device_names = dictionary_codes(events["device"])
    first = first_rows(track_codes, len(track_names))
    used = first < len(track_codes)
    devices = np.full(len(track_names), "", dtype=object)
    devices[used] = device_names[device_codes[first[used]]]
    return track_lanes(track_names, devices, lane_table)[track_codes]


def track_lanes(tracks: np.ndarray, devices: np.ndarray, lane_table: pd.DataFrame) -> np.ndarray:
    """The lane (int32) of each track, given its device and the `lanes` table (see `lane_of_rows`); -1 for a
    track the table cannot place."""
    lane_by_track = dict(zip(lane_table["track"], lane_table["lane"], strict=True))
    other = lane_by_track.get(FOLDED_TRACK.format(device=OTHER_DEVICES), -1)
    return np.array([lane_by_track.get(track, lane_by_track.get(FOLDED_TRACK.format(device=device), other))
                     for track, device in zip(tracks, devices, strict=True)], dtype=np.int32)


def first_rows(codes: np.ndarray, size: int) -> np.ndarray:
    """The first row holding each of `size` codes (`len(codes)` for a code that no row holds)."""
    first = np.full(size, len(codes), dtype=np.int64)
    np.minimum.at(first, codes, np.arange(len(codes)))
    return first


def _lane_quota(sizes: pd.Series, budget: int) -> pd.Series:
    """Lanes per device (`sizes`: its tracks): the most a device can have such that every device gets up to
    the same share, and all shares add up to at most `budget`; at least two (a track and its folded lane)."""
    share = max(budget // max(len(sizes), 1), 2)
    while share < int(sizes.max()) and np.minimum(sizes, share + 1).sum() <= budget:
        share += 1
    return np.minimum(sizes, share)


def _folded(group: pd.DataFrame, device: str, track: str, label: str) -> pd.DataFrame:
    """One lane standing for the tracks of `group`."""
    return pd.DataFrame({"device": [device], "track": [track], "label": [label],
                         "events": [int(group["events"].sum())], "max_depth": [int(group["max_depth"].max())],
                         "tracks": [len(group)]})


def _track_noun(group: pd.DataFrame) -> str:
    """What a device's tracks are called in a folded lane's label: threads, streams or tracks."""
    if (group["device"] == "cpu").all():
        return "threads"
    return "streams" if group["label"].str.startswith("stream").all() else "tracks"


def _numbered(table: pd.DataFrame) -> pd.DataFrame:
    table = table.reset_index(drop=True)
    table.insert(0, "lane", np.arange(len(table), dtype=np.int64))
    table["tracks"] = table["tracks"].astype(np.int64)
    return table[list(LANE_COLUMNS)]


def spans(trace: Trace, window: tuple[int, int] | None = None, lane_table: pd.DataFrame | None = None) -> pd.DataFrame:
    """The events overlapping `window` ([start, end) in ns; all when None), one row each, by row.

    Columns `SPAN_COLUMNS`: `row` is the event's row in the trace, `launcher` the row of the host op
    that launched it (-1 if none or unknown), `launched` the number of device events it launched.
    An instant (0 ns) counts as 1 ns long for the overlap test, so it belongs to the window it is in.
    """
    lane_table = lanes(trace) if lane_table is None else lane_table
    start, end = _bounds(trace)
    rows = np.flatnonzero(_overlaps(start, end, window)) if window is not None else np.arange(len(start))
    events = trace.events
    launcher = _numpy(events["launcher"])
    linked = launcher >= 0
    launched = np.bincount(launcher[linked], minlength=len(launcher))
    picked = events.select(["name", "kind", "shapes", "flops"]).take(pa.array(rows, type=pa.int64()))
    return pd.DataFrame({
        "row": rows,
        "lane": lane_of_rows(trace.events, lane_table)[rows],
        "depth": _numpy(events["depth"])[rows].astype(np.int64),
        "start_ns": start[rows],
        "end_ns": end[rows],
        "dur_ns": end[rows] - start[rows],
        "name": _strings(picked["name"]),
        "kind": _strings(picked["kind"]),
        "shapes": _strings(picked["shapes"]),
        "flops": _numpy(picked["flops"]).astype(np.float64),
        "launcher": launcher[rows],
        "launched": launched[rows].astype(np.int64),
    }, columns=list(SPAN_COLUMNS))


def time_extent(start: np.ndarray, dur: np.ndarray) -> tuple[int, int]:
    """The time axis of a timeline: the first start and last end of the events with a duration, or of all
    events (instants count 1 ns) when none has one; (0, 0) for none. A lone instant or marker (Kineto's
    "Record Window End", a tenth of the trace after the rest) never stretches it."""
    if not len(start):
        return 0, 0
    timed = dur > 0
    if timed.any():
        start, dur = start[timed], dur[timed]
    return int(start.min()), int(np.maximum(start + dur, start + 1).max())


def count_spans(trace: Trace, window: tuple[int, int]) -> int:
    """How many events overlap `window` ([start, end) in ns), as `spans` counts them."""
    start, end = _bounds(trace)
    return int(np.count_nonzero(_overlaps(start, end, window)))


def detail_window(trace: Trace, budget: int, start_ns: int | None = None) -> tuple[int, int]:
    """The longest window [start_ns, end) holding at most `budget` events (as `spans` counts them).

    By default it is the whole trace when that holds at most `budget` events, else it starts at the
    first step (`phases`), or at the trace's start when there is none.
    """
    start, end = _bounds(trace)
    if len(start) == 0:
        return 0, 0
    first, last = int(start.min()), int(np.maximum(end, start + 1).max())
    if start_ns is None:
        if len(start) <= budget:
            return first, last
        steps = phases(trace)
        steps = steps[steps["tier"] == 1]
        start_ns = int(steps["start_ns"].min()) if len(steps) else first
    ended_before = int(np.count_nonzero(np.maximum(end, start + 1) <= start_ns))
    k = budget + ended_before
    if k >= len(start):
        return start_ns, last
    window_end = int(np.partition(start, k)[k])  # fewer than k+1 events start before it
    return start_ns, max(window_end, start_ns)


def phases(trace: Trace) -> pd.DataFrame:
    """Step and phase annotations, to draw as bands: | name | start_ns | end_ns | tier |.

    Tier 0 holds the lifecycle phases (load, compile, warmup, measure), tier 1 the steps
    (`ProfilerStep#N`, `step N`): annotations, or ops where older Kineto traces record steps so. A
    name recorded on several tracks (a step is annotated on the host and again on the GPU) keeps its
    host span. Sorted by tier, then start.
    """
    rows, tier = _markers(trace)
    names = trace.events["name"].take(pa.array(rows, type=pa.int64()))
    start, end = _bounds(trace)
    device_codes, device_names = dictionary_codes(trace.events["device"])
    table = pd.DataFrame({
        "name": _strings(names),
        "start_ns": start[rows],
        "end_ns": end[rows],
        "tier": tier.astype(np.int64),
        "host": device_names[device_codes[rows]] == "cpu",
    })
    table = table.sort_values(["host", "start_ns"], ascending=[False, True], kind="stable")
    table = table.drop_duplicates("name").sort_values(["tier", "start_ns"], kind="stable")
    return table.drop(columns="host").reset_index(drop=True)


def density(trace: Trace, *, bins: int = 2048, levels: int = 4, lane_table: pd.DataFrame | None = None) -> Density:
    """Per lane density bars at `levels` resolutions: `bins`, 2·`bins`, 4·`bins`, ... bins over the trace.

    Busy time is the union of the lane's spans other than annotations and step markers (they mark
    regions rather than do work), except on a lane holding nothing else. Vectorized numpy: memory is
    a few arrays of the event count, never per-event Python objects.
    """
    lane_table = lanes(trace) if lane_table is None else lane_table
    start, end = _bounds(trace)
    n_lanes = len(lane_table)
    level_bins = tuple(bins * 2**level for level in range(levels))
    if len(start) == 0:
        return Density(0, 1, level_bins, pd.DataFrame(columns=list(DENSITY_COLUMNS)))
    first, last = time_extent(start, end - start)
    origin, span = first, max(last - first, 1)
    lane = lane_of_rows(trace.events, lane_table)
    kind_codes, kind_names = dictionary_codes(trace.events["kind"])
    name_codes, name_names = dictionary_codes(trace.events["name"])
    depth = _numpy(trace.events["depth"])
    busy_rows = np.flatnonzero(_busy_rows(trace, lane, n_lanes) & (end > start))
    union = union_intervals(lane[busy_rows], start[busy_rows] - origin, end[busy_rows] - origin, span)
    # Computed once at the finest level; each coarser level merges pairs of bins (bin b of a lane at
    # level l is bins 2b and 2b+1 at level l+1, so cell index c becomes c // 2).
    finest = level_bins[-1]
    width = span / finest
    # an instant outside the extent (`time_extent`) counts in the bin at the edge it lies past
    start_bin = np.clip(np.floor((start - origin) / width).astype(np.int64), 0, finest - 1)
    start_cell = lane.astype(np.int64) * finest + start_bin
    counts = np.bincount(start_cell, minlength=n_lanes * finest)
    union_cell, union_time, _ = spread(*union, width, finest)
    busy_ns = np.bincount(union_cell, weights=union_time, minlength=n_lanes * finest)
    lane64 = lane.astype(np.int64)
    span_cell, span_time, owner = spread(lane[busy_rows], start[busy_rows] - origin, end[busy_rows] - origin,
                                          width, finest)
    row = np.concatenate([busy_rows[owner], np.arange(len(start))])
    # Ties (nested spans covering the same time) go to the deeper, more specific span.
    weight = np.concatenate([span_time * (1 + 1e-6 * depth[busy_rows[owner]]), np.full(len(start), _START_WEIGHT)])
    totals = _totals(np.concatenate([span_cell, start_cell]), name_codes[row] * len(kind_names) + kind_codes[row],
                     weight)
    del span_cell, span_time, owner, row, weight
    frames = []
    for level in reversed(range(levels)):
        n_bins = level_bins[level]
        if n_bins < finest:
            counts, busy_ns = counts.reshape(-1, 2).sum(axis=1), busy_ns.reshape(-1, 2).sum(axis=1)
            totals = _totals(totals[0] // 2, totals[1], totals[2])
        width = span / n_bins
        busy = np.minimum(busy_ns / width, 1.0)
        overlap = overlapping_counts(lane64, start - origin, end - origin, width, n_bins, n_lanes)
        nonempty = np.flatnonzero((counts > 0) | (busy > 0))
        dominant = _dominant(*totals, nonempty)
        frames.append(pd.DataFrame({
            "level": np.full(len(nonempty), level, dtype=np.int64),
            "lane": nonempty // n_bins,
            "bin": nonempty % n_bins,
            "start_ns": origin + np.round(nonempty % n_bins * width).astype(np.int64),
            "end_ns": origin + np.round((nonempty % n_bins + 1) * width).astype(np.int64),
            "busy": busy[nonempty],
            "count": counts[nonempty].astype(np.int64),
            "overlap": overlap[nonempty],
            "kind": pd.Categorical.from_codes(dominant % len(kind_names), kind_names),
            "name": pd.Categorical.from_codes(dominant // len(kind_names), name_names),
        }))
    return Density(origin, span, level_bins, pd.concat(frames[::-1], ignore_index=True))


def select_level(density: Density, visible_ns: float, width_px: int) -> int:
    """The coarsest level whose bins are no wider than a pixel of a `width_px` wide view of `visible_ns`.

    The finest level when even its bins are wider: the view then shows bars a few pixels wide.
    """
    pixel_ns = visible_ns / max(width_px, 1)
    for level in range(len(density.bins)):
        if density.bin_ns(level) <= pixel_ns:
            return level
    return len(density.bins) - 1


def _markers(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the step and phase markers and their tier (0 phase, 1 step); see `phases`."""
    name_codes, dictionary = dictionary_codes(trace.events["name"])
    tier_of_name = np.array([0 if n in PHASE_NAMES else 1 if STEP_NAME.fullmatch(n) else -1 for n in dictionary],
                            dtype=np.int8)
    tier = tier_of_name[name_codes] if len(dictionary) else np.zeros(len(name_codes), dtype=np.int8)
    kind_codes, kind_names = dictionary_codes(trace.events["kind"])
    is_annotation = np.isin(kind_codes, np.flatnonzero(kind_names == "annotation"))
    is_op = np.isin(kind_codes, np.flatnonzero(kind_names == "op"))
    rows = np.flatnonzero((is_annotation & (tier >= 0)) | (is_op & (tier == 1)))
    return rows, tier[rows]


def _busy_rows(trace: Trace, lane: np.ndarray, n_lanes: int) -> np.ndarray:
    """Which rows' span time counts as busy: all but annotations and step markers, unless a lane holds
    nothing else."""
    kind_codes, kind_names = dictionary_codes(trace.events["kind"])
    marker = np.isin(kind_codes, np.flatnonzero(kind_names == "annotation"))
    marker[_markers(trace)[0]] = True
    has_work = np.bincount(lane[~marker], minlength=n_lanes) > 0
    return ~marker | ~has_work[lane]


def _totals(cell: np.ndarray, code: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weight summed per (cell, code) pair: (cell, code, total) with one entry per pair present."""
    n_codes = int(code.max()) + 1 if len(code) else 1
    summed = pd.Series(weight).groupby(cell * n_codes + code, sort=False).sum()  # hashing: no full sort
    keys = summed.index.to_numpy()
    return keys // n_codes, keys % n_codes, summed.to_numpy()


def _dominant(cell: np.ndarray, code: np.ndarray, total: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """For each of the sorted `cells`, the code with the largest total there (every cell must have one)."""
    order = np.lexsort((-total, cell))
    best = order[np.r_[True, cell[order][1:] != cell[order][:-1]]]
    return code[best][np.searchsorted(cell[best], cells)]


def _bounds(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of every event, int64 ns."""
    start = _numpy(trace.events["start_ns"])
    return start, start + _numpy(trace.events["dur_ns"])


def _overlaps(start: np.ndarray, end: np.ndarray, window: tuple[int, int]) -> np.ndarray:
    """Events overlapping [window): an instant counts as 1 ns long."""
    return (start < window[1]) & (np.maximum(end, start + 1) > window[0])


def _numpy(column: pa.ChunkedArray) -> np.ndarray:
    """A numeric column as one numpy array (no copy when the column has a single chunk)."""
    return column.to_numpy()


def dictionary_codes(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes and dictionary (an object array) of a dictionary-encoded string column."""
    combined = column.combine_chunks()
    if combined.null_count:
        combined = pc.fill_null(combined.dictionary_decode(), "").dictionary_encode()
    codes = combined.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return codes, np.asarray(combined.dictionary.to_pylist(), dtype=object)


def _strings(column: pa.ChunkedArray) -> np.ndarray:
    """A (possibly dictionary-encoded) string column as an object array, nulls as ''."""
    if pa.types.is_dictionary(column.type):
        column = column.cast(pa.string())
    return np.asarray(pc.fill_null(column, "").to_pylist(), dtype=object)


def strip_device(track: str, device: str) -> str:
    """A track's lane label: the track without its device's prefix (a track of another device keeps it)."""
    prefix = f"{device}/"
    return track[len(prefix):] if track.startswith(prefix) else track


def natural_key(text: str) -> tuple:
    """Sort key comparing the numbers inside a text by value ('stream 7' < 'stream 20')."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def _lane_key(device: str, label: str, events: int) -> tuple:
    kind, _, index = device.partition(":")
    if device == OTHER_DEVICES:
        return (2, "", 0), ()
    device_key = (1, "", 0) if device == "cpu" else (0, kind, int(index) if index.isdigit() else 0)
    within = (-int(events), natural_key(label)) if device == "cpu" else (natural_key(label),)
    return device_key, within
