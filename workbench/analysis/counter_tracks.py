"""Counter tracks: the step series drawn under the timeline's lanes (`workbench.views.counter_tracks`).

A trace's tracks, in groups, each a step series (a value that holds from one point to the next):

| group                   | tracks                                   | from                                          |
|-------------------------|------------------------------------------|-----------------------------------------------|
| `memory`                | `<device> allocated`, `<device> reserved`| the `memory` table (`analysis.memory`)        |
| `device busy`           | `<device> · <stream>`, per stream        | device work (`analysis.idle.DEVICE_WORK_KINDS`)|
|                         |                                          | on each device track: the covered fraction of |
|                         |                                          | each time bin, overlaps counted once          |
| `server metrics`        | the engine's sampled `/metrics`          | `counters` rows of device `server` (gauges as |
|                         |                                          | sampled, usage as %, `_total` counters as     |
|                         |                                          | rates: `analysis.serving.counter_tracks`)     |
| `<device> counters`     | every other counter series               | `counters` (Kineto `C` records, CUPTI range   |
|                         |                                          | counters: whatever the readers wrote)         |

Bounded by what is drawn: a series keeps at most `max_points` points (per time bin its minimum, its maximum
and its last point, so no peak or trough is lost), the busy tracks have `bins` bins, and at most
`MAX_STREAMS` busy streams (the busiest) and `MAX_SERIES` counter series are kept; `TrackSet.left_out` counts
the rest. Times are ns from the trace origin, like every time of a `Trace`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from workbench.analysis.idle import DEVICE_WORK_KINDS, covered_ns
from workbench.analysis.memory import memory_timeline, trace_end_ns
from workbench.analysis.serving import SERVER_DEVICE, TRACKS
from workbench.analysis.serving import counter_tracks as server_tracks
from workbench.analysis.timeline import natural_key, strip_device, union_intervals
from workbench.trace import Trace

BYTES, FRACTION = "bytes", "fraction"
"""Units the views scale (bytes in KiB/MiB/GiB, fractions as %); any other unit is a label written as is."""
MEMORY_GROUP, BUSY_GROUP, SERVER_GROUP = "memory", "device busy", "server metrics"
COUNTERS_SUFFIX = " counters"
"""A group of counter series is named for its device: `cuda:0 counters`, `cpu counters`."""
MAX_POINTS = 4_000
"""Points a series keeps at most by default: a few per pixel of a wide figure."""
BUSY_BINS = 1_000
"""Bins of a busy track by default."""
MAX_STREAMS = 16
"""Busy tracks kept at most: the busiest streams."""
MAX_SERIES = 64
"""Counter series kept at most (the server's sampler keeps as many: `serving.metrics_sampler.MAX_SERIES`)."""
POINT_COLUMNS = ("ts_ns", "end_ns", "value")


@dataclass(frozen=True)
class CounterTrack:
    """One step series. `points`: | ts_ns | end_ns | value |, sorted by time; the value holds over
    [ts_ns, end_ns) (the next point's time; the last holds to the end of the trace). `total` is how many
    points (or bins) the series had before it was decimated to `len(points)`."""

    group: str
    name: str
    unit: str
    points: pd.DataFrame
    total: int

    @property
    def decimated(self) -> bool:
        """Whether points were left out (never a minimum or maximum of a bin)."""
        return len(self.points) < self.total


@dataclass(frozen=True)
class TrackSet:
    """A trace's tracks in drawing order (grouped), and per group how many tracks were left out."""

    tracks: tuple[CounterTrack, ...]
    left_out: dict[str, int] = field(default_factory=dict)

    @property
    def groups(self) -> list[str]:
        """The groups, in drawing order."""
        return list(dict.fromkeys(track.group for track in self.tracks))


def counter_tracks(trace: Trace, *, max_points: int = MAX_POINTS, bins: int = BUSY_BINS,
                   window: tuple[int, int] | None = None) -> TrackSet:
    """Every track of `trace`: memory, device busy (over `window` [start, end) ns, by default the extent of
    the trace's events), server metrics, then the other counters. Empty when the trace has none."""
    if max_points < 3 or bins < 1:
        raise ValueError(f"counter tracks need max_points >= 3 and bins >= 1, got {max_points} and {bins}")
    end = trace_end_ns(trace)
    if trace.counters.num_rows:
        end = max(end, int(pc.max(trace.counters["ts_ns"]).as_py()))
    busy, streams_left = busy_tracks(trace, bins=bins, window=window)
    series, series_left = series_tracks(trace, end_ns=end, max_points=max_points)
    left_out = {group: n for group, n in ((BUSY_GROUP, streams_left), *series_left.items()) if n}
    return TrackSet((*memory_tracks(trace, end_ns=end, max_points=max_points), *busy, *series), left_out)


def memory_tracks(trace: Trace, *, end_ns: int, max_points: int = MAX_POINTS) -> list[CounterTrack]:
    """Allocated bytes per device (accelerators first) after each memory record, and reserved bytes where the
    trace records any above 0 (a CPU's reserved bytes are always 0)."""
    timeline = memory_timeline(trace)
    tracks = []
    for device in sorted(timeline["device"].unique(), key=lambda d: (d == "cpu", natural_key(d))):
        rows = timeline[timeline["device"] == device]
        ts = rows["ts_ns"].to_numpy()
        tracks.append(step_track(MEMORY_GROUP, f"{device} allocated", BYTES, ts,
                                 rows["allocated_bytes"].to_numpy().astype(np.float64), end_ns, max_points))
        reserved = rows["reserved_bytes"].to_numpy()
        if (reserved > 0).any():
            tracks.append(step_track(MEMORY_GROUP, f"{device} reserved", BYTES, ts, reserved, end_ns, max_points))
    return tracks


def busy_tracks(trace: Trace, *, bins: int = BUSY_BINS, window: tuple[int, int] | None = None,
                max_streams: int = MAX_STREAMS) -> tuple[list[CounterTrack], int]:
    """Per device track (stream), the fraction of each of `bins` equal bins of `window` (default: first event
    start to last event end) that its device work covers, overlapping work counted once; the `max_streams`
    busiest tracks (by busy time in the window), in device and stream order, and how many were left out."""
    events = trace.events.select(["start_ns", "dur_ns", "kind", "device", "track"])
    if not events.num_rows:
        return [], 0
    if window is None:
        start_all = events["start_ns"].to_numpy()
        window = (int(start_all.min()), int((start_all + events["dur_ns"].to_numpy()).max()))
    lo, hi = int(window[0]), int(window[1])
    if hi <= lo:
        raise ValueError(f"busy window [{lo}, {hi}) ns is empty")
    kind = pc.cast(events["kind"], pa.string())
    device = pc.cast(events["device"], pa.string())
    work = events.filter(pc.and_(pc.is_in(kind, pa.array(DEVICE_WORK_KINDS)), pc.not_equal(device, "cpu")))
    if not work.num_rows:
        return [], 0
    start = work["start_ns"].to_numpy().astype(np.int64)
    end = np.minimum(start + work["dur_ns"].to_numpy(), hi)
    start = np.maximum(start, lo)
    keep = end > start
    if not keep.any():
        return [], 0
    names = pd.DataFrame({"device": pc.cast(work["device"], pa.string()).to_numpy(zero_copy_only=False)[keep],
                          "track": pc.cast(work["track"], pa.string()).to_numpy(zero_copy_only=False)[keep]})
    codes, pairs = pd.factorize(pd.MultiIndex.from_frame(names))
    span = max(abs(lo), abs(hi))
    lane, merged_start, merged_end = union_intervals(codes.astype(np.int64), start[keep], end[keep], span)
    bounds = np.searchsorted(lane, np.arange(len(pairs) + 1))  # the union comes in lane order
    busy_ns = np.add.reduceat(merged_end - merged_start, bounds[:-1]) if len(lane) else np.zeros(0)
    chosen = np.argsort(-busy_ns, kind="stable")[:max_streams]
    chosen = sorted(chosen, key=lambda c: (natural_key(pairs[c][0]), natural_key(pairs[c][1])))
    edges = bin_edges(lo, hi, bins)
    tracks = []
    for code in chosen:
        device_name, track = pairs[code]
        s, e = merged_start[bounds[code]:bounds[code + 1]], merged_end[bounds[code]:bounds[code + 1]]
        fraction = covered_ns(s, e, edges[:-1], edges[1:]) / np.diff(edges)
        points = pd.DataFrame({"ts_ns": edges[:-1], "end_ns": edges[1:], "value": fraction})
        tracks.append(CounterTrack(BUSY_GROUP, f"{device_name} · {strip_device(track, device_name)}", FRACTION,
                                   points, len(points)))
    return tracks, len(pairs) - len(chosen)


def series_tracks(trace: Trace, *, end_ns: int, max_points: int = MAX_POINTS,
                  max_series: int = MAX_SERIES) -> tuple[list[CounterTrack], dict[str, int]]:
    """The `counters` table's series: the server's first (`analysis.serving.counter_tracks` for the series it
    knows, the others as sampled), then each device's, series in natural name order; at most `max_series`,
    and per group how many were left out."""
    counters = trace.counters
    if not counters.num_rows:
        return [], {}
    frame = pd.DataFrame({"device": pc.cast(counters["device"], pa.string()).to_numpy(zero_copy_only=False),
                          "name": pc.cast(counters["name"], pa.string()).to_numpy(zero_copy_only=False),
                          "ts_ns": counters["ts_ns"].to_numpy(), "value": counters["value"].to_numpy()})
    tracks = []
    for _, unit, points in server_tracks(counters):
        for label, part in points.groupby("series", sort=False):
            tracks.append(step_track(SERVER_GROUP, str(label), unit, part["ts_ns"].to_numpy().astype(np.int64),
                                     part["value"].to_numpy(), end_ns, max_points))
    known = {name for *_, series in TRACKS for name, _ in series}
    rest = frame[~((frame["device"] == SERVER_DEVICE) & frame["name"].isin(known))]
    keys = sorted(rest.groupby(["device", "name"], sort=False).groups.items(),
                  key=lambda item: (item[0][0] != SERVER_DEVICE, natural_key(item[0][0]), natural_key(item[0][1])))
    for (device, name), rows in keys:
        part = rest.loc[rows].sort_values("ts_ns", kind="stable")
        group = SERVER_GROUP if device == SERVER_DEVICE else f"{device}{COUNTERS_SUFFIX}"
        tracks.append(step_track(group, name, "", part["ts_ns"].to_numpy(), part["value"].to_numpy(), end_ns,
                                 max_points))
    left: dict[str, int] = {}
    for track in tracks[max_series:]:
        left[track.group] = left.get(track.group, 0) + 1
    return tracks[:max_series], left


def step_track(group: str, name: str, unit: str, ts_ns: np.ndarray, value: np.ndarray, end_ns: int,
               max_points: int) -> CounterTrack:
    """A track of the step series (`ts_ns` sorted), each value held to the next point's time, the last to
    `end_ns` (or its own time, if later); decimated to at most `max_points` points (`decimate`)."""
    ts_ns, value = np.asarray(ts_ns, dtype=np.int64), np.asarray(value, dtype=np.float64)
    kept = decimate(ts_ns, value, max_points)
    ts, held = ts_ns[kept], value[kept]
    ends = np.append(ts[1:], max(end_ns, int(ts[-1]))) if len(ts) else ts
    return CounterTrack(group, name, unit, pd.DataFrame({"ts_ns": ts, "end_ns": ends, "value": held}), len(ts_ns))


def decimate(ts_ns: np.ndarray, value: np.ndarray, max_points: int) -> np.ndarray:
    """Rows to keep of a series sorted by time so that at most `max_points` remain: all of them when they fit,
    else per each of `max_points // 3` equal time bins the row of its minimum, of its maximum and its last row
    (the level carried into the next bin). NaN (a gap) is neither; a bin of NaN only keeps one of them."""
    n = len(ts_ns)
    if n <= max_points:
        return np.arange(n)
    bins = max(max_points // 3, 1)
    t0, span = int(ts_ns[0]), int(ts_ns[-1]) - int(ts_ns[0]) + 1
    # (ts - t0) * bins may pass int64 for a long trace: scale in float, then keep bins in order and in range
    which = np.minimum(((ts_ns - t0).astype(np.float64) * bins / span).astype(np.int64), bins - 1)
    which = np.maximum.accumulate(which)
    first = np.flatnonzero(np.r_[True, which[1:] != which[:-1]])
    last = np.r_[first[1:], n] - 1
    low = np.lexsort((np.where(np.isnan(value), np.inf, value), which))  # bins stay in place, minimum first
    high = np.lexsort((np.where(np.isnan(value), -np.inf, value), which))  # maximum last
    return np.unique(np.concatenate([low[first], high[last], last]))


def bin_edges(lo: int, hi: int, bins: int) -> np.ndarray:
    """`bins` + 1 integer edges splitting [lo, hi) ns into equal bins (fewer bins when [lo, hi) is shorter
    than `bins` ns: each bin at least 1 ns)."""
    bins = max(min(bins, hi - lo), 1)
    return np.array([lo + (hi - lo) * k // bins for k in range(bins + 1)], dtype=np.int64)
