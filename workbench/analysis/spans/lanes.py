"""The lanes a timeline window draws: the index's own (`IndexLane`), and the tracks of a folded lane expanded
into lanes of their own, a page at a time (`TrackLane`, `expanded`).

A trace of more than `MAX_LANES` tracks draws its quietest tracks folded into one "N more threads" lane per
device (and its quietest devices into "other devices"; `workbench.analysis.timeline.fold_lanes`). Expanding
such a lane (`spans.window(..., expand=lane, offset=k)`, the `spans` route's `expand` and `offset`) gives
`MAX_LANES` of its tracks, busiest first from the `offset`-th, a lane each, and keeps the folded lane for
the tracks left out, so a reply stays bounded by what is drawn however many tracks a lane folds.

The index keeps no track per event: the `track` column is read from events.parquet once per open run
(4 bytes an event) and cached beside the index.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from workbench.analysis.spans.build import busy_union, covered_ns, key_positions, longest_keys
from workbench.analysis.spans.index import MAX_OPEN_RUNS, SpanIndex
from workbench.analysis.timeline import MAX_LANES, OTHER_DEVICES, dictionary_codes, natural_key, strip_device
from workbench.errors import BundleError


@dataclass(frozen=True)
class IndexLane:
    """Lane `lane` of the index, as the index built it; `info` holds the reply's lane fields."""

    lane: int
    info: dict[str, Any]

    @classmethod
    def of(cls, index: SpanIndex, lane: int) -> IndexLane:
        row = index.lanes.iloc[lane]
        return cls(lane, {"lane": lane, "device": row["device"], "track": row["track"], "label": row["label"],
                          "rows": int(row["max_depth"]) + 1, "events": int(row["events"]),
                          "tracks": int(row["tracks"])})

    def count(self, index: SpanIndex, start_ns: int, end_ns: int) -> int:
        """How many events overlap [start_ns, end_ns)."""
        return index.count_overlapping(self.lane, start_ns, end_ns)

    def overlapping(self, index: SpanIndex, start_ns: int, end_ns: int) -> np.ndarray:
        """Positions of the events overlapping [start_ns, end_ns), in start order (an instant counts 1 ns)."""
        return index.overlapping(self.lane, start_ns, end_ns)

    def busy_ns(self, index: SpanIndex, edges: np.ndarray) -> np.ndarray:
        """Work time covered between consecutive `edges` (float ns)."""
        return index.busy_ns(self.lane, edges)

    def starting(self, index: SpanIndex, edges: np.ndarray) -> np.ndarray:
        """For each edge, the position of the lane's first event starting at or after it."""
        section = index.lane_slice(self.lane)
        return section.start + np.searchsorted(index.start[section], edges)

    def longest(self, index: SpanIndex, at: np.ndarray, started: np.ndarray) -> np.ndarray:
        """The position of the longest event (markers below any work) starting in each bin of `started`
        (non-empty bins; `at` from `starting`)."""
        return index.longest(at[started], at[started + 1])


@dataclass(frozen=True)
class TrackLane:
    """Some tracks of a folded lane drawn as one lane: the reply's lane fields (`info`), its events'
    positions in start order, and the union of its work intervals (`busy_union`'s arrays)."""

    info: dict[str, Any]
    positions: np.ndarray
    busy: dict[str, np.ndarray]

    def count(self, index: SpanIndex, start_ns: int, end_ns: int) -> int:
        """How many events overlap [start_ns, end_ns)."""
        return len(self.overlapping(index, start_ns, end_ns))

    def overlapping(self, index: SpanIndex, start_ns: int, end_ns: int) -> np.ndarray:
        """Positions of the events overlapping [start_ns, end_ns), in start order (an instant counts 1 ns)."""
        starts = index.start[self.positions]
        ends = starts + index.dur[self.positions]
        inside = ((starts >= start_ns) & (starts < end_ns)) | ((starts < start_ns) & (ends > start_ns))
        return self.positions[inside]

    def busy_ns(self, index: SpanIndex, edges: np.ndarray) -> np.ndarray:
        """Work time covered between consecutive `edges` (float ns)."""
        return covered_ns(self.busy["busy_start"], self.busy["busy_end"], self.busy["busy_before"], edges)

    def starting(self, index: SpanIndex, edges: np.ndarray) -> np.ndarray:
        """For each edge, how many of the lane's events start before it (indices into `positions`)."""
        return np.searchsorted(index.start[self.positions], edges)

    def longest(self, index: SpanIndex, at: np.ndarray, started: np.ndarray) -> np.ndarray:
        """The position of the longest event (markers below any work) starting in each bin of `started`
        (non-empty bins; `at` from `starting`)."""
        keys = longest_keys(index.is_marker, index.dur, self.positions[: at[started[-1] + 1]])
        return key_positions(np.maximum.reduceat(keys, at[started]), index.size)


def drawn_lanes(index: SpanIndex, expand: int | None = None, offset: int = 0) -> list[IndexLane | TrackLane]:
    """The lanes a window draws, in drawing order: the index's, with lane `expand` (if any) expanded in place."""
    lanes: list[IndexLane | TrackLane] = [IndexLane.of(index, lane) for lane in range(len(index.lanes))]
    if expand is None:
        return lanes
    if not 0 <= expand < len(lanes):
        raise ValueError(f"expand: the run has lanes 0 to {len(lanes) - 1}, got {expand}")
    return [*lanes[:expand], *expanded(index, expand, offset), *lanes[expand + 1:]]


def expanded(index: SpanIndex, lane: int, offset: int = 0, limit: int = MAX_LANES) -> list[TrackLane]:
    """The tracks of folded lane `lane`, busiest first (then by name, numbers by value), from the `offset`-th:
    `limit` lanes of one track each (`parent` names the folded lane), then the folded lane for the tracks left
    out, if any.
    Raises ValueError when `lane` folds no tracks or `offset` is past its last track."""
    info = index.lanes.iloc[lane]
    if int(info["tracks"]) < 2:
        raise ValueError(f"lane {lane} ({info['label']}) is one track: there is nothing to expand")
    section = index.lane_slice(lane)
    codes, names = _track_codes(index)
    lane_codes = codes[index.row[section]]
    tracks, counts = np.unique(lane_codes, return_counts=True)
    if not 0 <= offset < len(tracks):
        raise ValueError(f"offset: lane {lane} folds {len(tracks):,} tracks, so offset is 0 to {len(tracks) - 1}, "
                         f"got {offset}")
    order = np.array(sorted(range(len(tracks)), key=lambda i: (-counts[i], natural_key(str(names[tracks[i]])))),
                     dtype=np.int64)
    shown = order[offset:offset + limit]
    group = np.full(len(tracks), len(shown), dtype=np.int64)  # tracks left out: the last group
    group[shown] = np.arange(len(shown))
    per_event = group[np.searchsorted(tracks, lane_codes)]
    in_groups = np.argsort(per_event, kind="stable")  # stable: each group keeps the lane's start order
    bounds = np.searchsorted(per_event[in_groups], np.arange(len(shown) + 2))
    positions = section.start + in_groups
    device = str(info["device"])
    out = []
    for g in range(len(shown) + 1):
        members = positions[bounds[g]:bounds[g + 1]]
        if not len(members):
            continue
        if g < len(shown):
            track = str(names[tracks[shown[g]]])
            fields = {"lane": len(index.lanes) + g, "device": device, "track": track,
                      "label": strip_device(track, device), "tracks": 1, "parent": lane}
        else:
            left = len(tracks) - len(shown)
            noun = "tracks" if device == OTHER_DEVICES else str(info["label"]).split(" ", 2)[-1]
            fields = {"lane": lane, "device": device, "track": str(info["track"]),
                      "label": f"{left:,} more {noun}", "tracks": left, "parent": None}
        out.append(TrackLane(fields | {"rows": int(index.depth[members].max()) + 1, "events": len(members)},
                             members, busy_union(index.start[members], index.dur[members],
                                                 index.is_marker[members], np.array([0, len(members)]))))
    return out


@lru_cache(maxsize=MAX_OPEN_RUNS)
def _track_codes(index: SpanIndex) -> tuple[np.ndarray, np.ndarray]:
    """Each event row's track code, and the track names, read from the index's events.parquet."""
    try:
        column = pq.read_table(index.path, columns=["track"], memory_map=True).column("track")
    except (OSError, pa.ArrowException) as exc:
        raise BundleError(f"{index.path}: cannot read the track column: {exc}") from exc
    if not pa.types.is_dictionary(column.type):
        column = column.dictionary_encode()
    codes, names = dictionary_codes(column.unify_dictionaries())
    return codes.astype(np.int32), names
