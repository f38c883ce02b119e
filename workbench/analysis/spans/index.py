"""An open, indexed table of a run's events for windowed timeline queries, and an LRU of open runs.

A run's index (`workbench.analysis.spans.build`) holds the columns the timeline needs as numpy arrays in
(lane, start) order, with per-lane bounds, so every query is a few binary searches per lane and a request
costs the events it returns, not the trace:

- overlap: per lane, the few longest events are kept aside and scanned directly; the others are at most
  `short_max[lane]` long, so an event overlapping [s, e) starts within [s - short_max, e): two
  `searchsorted`s bound the candidates.
- busy time: per lane, the union of its work intervals with a running total of covered time, so the busy
  time of any interval is two binary searches.

The index is kept beside events.parquet in `events.index` (`INDEX_FILE`, `workbench.analysis.spans.mapped`),
written with the bundle (`write_index`), so opening a run maps that file: no sort, no gather, and only the
pages a query touches are read. A bundle without one (written by an earlier workbench), or whose file
describes another events table, is indexed from the Parquet on first open, and the file is kept in the
bundle when its folder is writable.

`RunCache` keeps the indexes of the most recently used runs (keyed by the events file's path, size and
modification time, so a replaced run is re-read); `RUNS` is the process's cache, which the server and
the notebook share.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench.analysis.spans import mapped as span_file
from workbench.analysis.spans.build import BLOCK, INDEX_VERSION, build, covered_ns, key_positions, longest_keys
from workbench.errors import BundleError

INDEX_FILE = "events.index"
"""The index file's name, beside events.parquet in a bundle."""
MAX_OPEN_RUNS = 4
"""Runs `RUNS` keeps open (a 10M-event run takes under 1 GiB)."""
_LANE_INTEGERS = ("lane", "events", "max_depth", "tracks")


@dataclass(frozen=True, eq=False)
class SpanIndex:
    """The timeline columns of one run, in (lane, start) order; `pos` below means a position in that order.

    `row[pos]` is the event's row in events.parquet and `position[row]` its inverse; `launcher` and
    `parent` hold rows (-1 for none). `names`/`kinds`/`shape_values` are the dictionaries of the
    `name`/`kind`/`shapes` codes;
    `marker[code]` says a name marks a step or phase, `is_marker[pos]` an event is a marker or annotation.
    Lane `l` holds positions `lane_start[l]:lane_start[l + 1]`; `long[l]` are its positions kept aside,
    `short_max[l]` bounds the duration of the others. `busy_start/busy_end/busy_before` hold each
    lane's union of work intervals (from `busy_offset[l]`), `busy_before` the covered time before each.
    `block_key[b]` is the largest `longest_keys` of positions `b·BLOCK` to `(b + 1)·BLOCK` (then a -1).
    `extent` is the first start and last end (instants count 1 ns) of the run's events, (0, 0) when none.
    The arrays are read-only views of the mapped index file when the run has one.
    """

    path: Path
    lanes: pd.DataFrame
    row: np.ndarray
    position: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    name: np.ndarray
    kind: np.ndarray
    depth: np.ndarray
    launcher: np.ndarray
    parent: np.ndarray
    flops: np.ndarray
    launched: np.ndarray
    shapes: np.ndarray
    names: np.ndarray
    kinds: np.ndarray
    shape_values: np.ndarray
    marker: np.ndarray
    is_marker: np.ndarray
    lane_start: np.ndarray
    long: tuple[np.ndarray, ...]
    short_max: np.ndarray
    busy_offset: np.ndarray
    busy_start: np.ndarray
    busy_end: np.ndarray
    busy_before: np.ndarray
    block_key: np.ndarray
    extent: tuple[int, int]

    @classmethod
    def open(cls, events_path: str | os.PathLike[str]) -> SpanIndex:
        """The index of the events table at `events_path` (a bundle's events.parquet): its index file mapped
        when it describes this table, else built from the table (and kept beside it when the folder is
        writable). Raises BundleError naming the file when the table cannot be read."""
        path = Path(events_path)
        source = _source(path)
        index = cls._stored(path, source)
        if index is not None:
            return index
        built = build(path)
        if _keep(path, built, source):
            index = cls._stored(path, source)  # the file just written, mapped: its pages rather than a copy
        return cls(path=path, **built) if index is None else index

    @classmethod
    def _stored(cls, path: Path, source: str) -> SpanIndex | None:
        """The index in the index file beside `path`, mapped; None when there is none or it describes another
        events table (`source` is the table's fingerprint) or another version of the index."""
        stored = span_file.read(path.with_name(INDEX_FILE))
        if stored is None or stored.meta.get("version") != INDEX_VERSION or stored.meta.get("source") != source:
            return None
        arrays, meta = stored.arrays, stored.meta
        try:
            bounds = itertools.pairwise(arrays["long_offset"].tolist())
            long = tuple(arrays["long_positions"][lo:hi] for lo, hi in bounds)
            lanes = pd.DataFrame(meta["lanes"]).astype({name: np.int64 for name in _LANE_INTEGERS})
            first, last = meta["extent"]
            return cls(path=path, lanes=lanes, long=long, extent=(int(first), int(last)),
                       **{f.name: arrays[f.name] for f in fields(cls) if f.name in arrays})
        except (KeyError, TypeError, ValueError):  # a file of this version but not of this layout: build again
            return None

    @property
    def size(self) -> int:
        """Events in the run."""
        return len(self.start)

    def lane_slice(self, lane: int) -> slice:
        """Positions of lane `lane`."""
        return slice(int(self.lane_start[lane]), int(self.lane_start[lane + 1]))

    def overlapping(self, lane: int, start_ns: int, end_ns: int) -> np.ndarray:
        """Sorted positions of lane `lane`'s events overlapping [start_ns, end_ns) (an instant counts 1 ns)."""
        lo, hi = int(self.lane_start[lane]), int(self.lane_start[lane + 1])
        starts = self.start[lo:hi]
        first_inside = lo + int(np.searchsorted(starts, start_ns))
        past = lo + int(np.searchsorted(starts, end_ns))
        earliest = lo + int(np.searchsorted(starts, start_ns - int(self.short_max[lane])))
        before = np.arange(earliest, first_inside)
        short = self.dur[before] <= self.short_max[lane]
        before = before[short & (self.start[before] + self.dur[before] > start_ns)]
        kept = self.long[lane]
        kept = kept[(self.start[kept] < start_ns) & (self.start[kept] + self.dur[kept] > start_ns)]
        return np.concatenate([np.sort(np.concatenate([before, kept])), np.arange(first_inside, past)])

    def count_overlapping(self, lane: int, start_ns: int, end_ns: int) -> int:
        """How many events of lane `lane` overlap [start_ns, end_ns), without listing them."""
        lo, hi = int(self.lane_start[lane]), int(self.lane_start[lane + 1])
        starts = self.start[lo:hi]
        first_inside, past = np.searchsorted(starts, [start_ns, end_ns])
        earliest = int(np.searchsorted(starts, start_ns - int(self.short_max[lane])))
        before = slice(lo + earliest, lo + int(first_inside))
        dur = self.dur[before]
        open_short = np.count_nonzero((dur <= self.short_max[lane]) & (self.start[before] + dur > start_ns))
        kept = self.long[lane]
        open_long = np.count_nonzero((self.start[kept] < start_ns) & (self.start[kept] + self.dur[kept] > start_ns))
        return int(past - first_inside) + int(open_short) + int(open_long)

    def busy_ns(self, lane: int, edges: np.ndarray) -> np.ndarray:
        """Work time of lane `lane` covered between consecutive `edges` (sorted ns; float ns out)."""
        lo, hi = int(self.busy_offset[lane]), int(self.busy_offset[lane + 1])
        return covered_ns(self.busy_start[lo:hi], self.busy_end[lo:hi], self.busy_before[lo:hi], edges)


    def longest(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """For consecutive non-empty ranges of positions [starts[i], ends[i]), the position of each one's longest
        event (the largest `_longest_keys`: markers below any work, ties to the first). Ranges holding few
        events are reduced directly; for many, whole blocks use `block_key` and only the partial blocks at
        each end are looked at, so the cost does not grow with the events of a window."""
        first, last = int(starts[0]), int(ends[-1])
        if last - first <= 4 * BLOCK * len(starts):
            keys = longest_keys(self.is_marker, self.dur, np.arange(first, last))
            return key_positions(np.maximum.reduceat(keys, starts - first), self.size)
        blocks_from, blocks_to = -(-starts // BLOCK), ends // BLOCK
        whole = blocks_from < blocks_to
        best = np.full(len(starts), -1, dtype=np.int64)
        if whole.any():
            bounds = np.empty(2 * int(whole.sum()), dtype=np.int64)
            bounds[0::2], bounds[1::2] = blocks_from[whole], blocks_to[whole]
            best[whole] = np.maximum.reduceat(self.block_key, bounds)[0::2]
        for lo, hi in ((starts, np.where(whole, blocks_from * BLOCK, ends)), (np.where(whole, blocks_to * BLOCK, ends),
                                                                            ends)):
            lengths = hi - lo
            positions = np.repeat(lo - (np.cumsum(lengths) - lengths), lengths) + np.arange(int(lengths.sum()))
            np.maximum.at(best, np.repeat(np.arange(len(lo)), lengths),
                          longest_keys(self.is_marker, self.dur, positions))
        return key_positions(best, self.size)


class RunCache:
    """The indexes of the `max_runs` most recently used runs, by events file (thread-safe)."""

    def __init__(self, max_runs: int = MAX_OPEN_RUNS) -> None:
        if max_runs < 1:
            raise ValueError(f"max_runs must be at least 1, got {max_runs}")
        self.max_runs = max_runs
        self._open: OrderedDict[tuple[str, int, int], SpanIndex] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, events_path: str | os.PathLike[str]) -> SpanIndex:
        """The index of `events_path`, opened (evicting the least recently used run) if not open."""
        path = Path(events_path)
        try:
            stat = path.stat()
        except OSError as exc:
            raise BundleError(f"{path}: cannot read the events table: {exc.strerror or exc}") from exc
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        with self._lock:  # one build at a time: two requests for a new run must not both build it
            index = self._open.get(key)
            if index is None:
                index = SpanIndex.open(path)
                self._open[key] = index
            self._open.move_to_end(key)
            while len(self._open) > self.max_runs:
                self._open.popitem(last=False)
            return index

    def paths(self) -> list[Path]:
        """The events files open now, least recently used first."""
        with self._lock:
            return [Path(key[0]) for key in self._open]

    def clear(self) -> None:
        """Close every run."""
        with self._lock:
            self._open.clear()


RUNS = RunCache()
"""The process's open runs (the server's requests and the notebook's refinements share it)."""


def write_index(events_path: str | os.PathLike[str]) -> Path:
    """Build the index of the events table at `events_path` and write it beside it (atomically); its path.
    The bundle writer calls this inside the bundle's temporary folder, so a bundle is complete with it."""
    path = Path(events_path)
    arrays, meta = _file_form(build(path), _source(path))
    span_file.write(path.with_name(INDEX_FILE), arrays, meta)
    return path.with_name(INDEX_FILE)


def _source(events_path: Path) -> str:
    """The fingerprint of the events table that an index file must carry to be used for it."""
    try:
        return span_file.parquet_fingerprint(events_path)
    except (OSError, ValueError) as exc:
        raise BundleError(f"{events_path}: cannot read the events table: {exc}") from exc


def _keep(events_path: Path, built: dict[str, Any], source: str) -> bool:
    """Write the index file of a bundle that had none (or a stale one), if its folder is writable; whether
    it was written. A failure to write (read-only media, a full disk) only costs the next open a build."""
    if not os.access(events_path.parent, os.W_OK):
        return False
    arrays, meta = _file_form(built, source)
    try:
        span_file.write(events_path.with_name(INDEX_FILE), arrays, meta)
    except OSError:
        return False
    return True


def _file_form(built: dict[str, Any], source: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays and metadata of an index file, from `build`'s fields."""
    arrays = {name: value for name, value in built.items() if isinstance(value, np.ndarray)}
    long = built["long"]
    arrays["long_positions"] = np.concatenate(long) if long else np.zeros(0, np.int64)
    arrays["long_offset"] = np.r_[0, np.cumsum([len(positions) for positions in long])].astype(np.int64)
    lanes = built["lanes"]
    meta = {"version": INDEX_VERSION, "source": source, "extent": list(built["extent"]),
            "lanes": {column: lanes[column].tolist() for column in lanes.columns}}
    return arrays, meta
