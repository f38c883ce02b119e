"""Vectorized span nesting: parent and depth per track, and the innermost span enclosing a time.

Readers call these on whole columns; a Python loop over a million spans would cost seconds.
Spans on one track are assumed to nest (as host threads' ranges do); where they merely overlap,
the later span is treated as a child of the one still open, and a parent that does not cover
the child's start is dropped. Identical spans nest as a chain, each inside the one before it; the cost
stays O(n log n) however deep a chain is.
"""

from __future__ import annotations

import numpy as np

DEPTH_LIMIT = int(np.iinfo(np.int16).max)
"""The deepest depth the `depth` column holds; `nest_spans` gives deeper spans this depth (their parents
stay exact), so a reader can refuse a trace that nests deeper (`depth.max() >= DEPTH_LIMIT`)."""


def _track_segments(track: np.ndarray, order: np.ndarray) -> list[np.ndarray]:
    """Split `order` (sorted by track first) into one index array per track."""
    cuts = np.flatnonzero(np.diff(track[order])) + 1
    return np.split(order, cuts)


def span_order(track: np.ndarray, start: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Rows sorted by track, then start, then longest first (parents before their children).

    Sorts one int64 key (track in the high bits) with numpy's vectorized quicksort and breaks the
    ties of equal (track, start) by duration; a lexsort of the three columns is several times slower.
    """
    if len(start) == 0:
        return np.zeros(0, dtype=np.int64)
    offset = start - start.min()
    if int(offset.max()) >= 2**44 or int(track.max()) >= 2**19:
        return np.lexsort((-dur, start, track))
    key = (track.astype(np.int64) << 44) | offset
    order = np.argsort(key)
    sorted_key = key[order]
    tie = sorted_key[1:] == sorted_key[:-1]
    if tie.any():
        members = np.flatnonzero(np.concatenate([tie, [False]]) | np.concatenate([[False], tie]))
        group = np.cumsum(np.concatenate([[True], ~tie]))[members]
        rows = order[members]
        order[members] = rows[np.lexsort((-dur[rows], group))]
    return order


def nest_spans(track: np.ndarray, start: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Parent row (-1 at top) and depth of every span, per track.

    >>> nest_spans(np.array([0, 0, 0, 1]), np.array([0, 2, 5, 3]), np.array([10, 3, 1, 1]))
    (array([-1,  0,  0, -1]), array([0, 1, 1, 0], dtype=int16))
    """
    n = len(start)
    parent = np.full(n, -1, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int16)
    if n == 0:
        return parent, depth
    order = span_order(track, start, dur)
    for seg in _track_segments(track, order):
        s = start[seg]
        e = s + dur[seg]
        pos = np.arange(len(seg))
        # Spans that ended at or before each start, minus zero-length spans at the same instant
        # that sort at or after it (they are not "before" it).
        ended = np.searchsorted(np.sort(e), s, side="right")
        zero_starts = np.sort(s[dur[seg] == 0])
        z = np.searchsorted(zero_starts, s, side="right") - np.searchsorted(zero_starts, s, side="left")
        group_end = np.searchsorted(s, s, side="right")
        ended_before = ended - np.minimum(z, group_end - pos)
        d = np.maximum(pos - ended_before, 0)
        seg_parent = _last_one_level_up(d)
        has = seg_parent >= 0
        covered = np.zeros(len(seg), dtype=bool)
        covered[has] = e[seg_parent[has]] > s[has]
        seg_parent[~covered] = -1
        depth[seg] = np.minimum(np.where(covered | (d == 0), d, 0), DEPTH_LIMIT).astype(np.int16)
        parent[seg[covered]] = seg[seg_parent[covered]]
    return parent, depth


def _last_one_level_up(d: np.ndarray) -> np.ndarray:
    """For each position, the last earlier position whose level is one less (-1 if none), for all levels
    at once: one sort by (level, position) and one binary search, so a chain of identical spans a million
    deep costs what a flat track does (a loop over levels would cost levels × spans)."""
    pos = np.arange(len(d), dtype=np.int64)
    if len(d) == 0:
        return pos
    by_level = np.argsort(d, kind="stable")  # by level, then position
    width = len(d) + 1
    keys = d[by_level].astype(np.int64) * width + by_level
    found = np.searchsorted(keys, (d.astype(np.int64) - 1) * width + pos) - 1
    at = by_level[np.maximum(found, 0)]
    return np.where((d > 0) & (found >= 0) & (d[at] == d - 1), at, -1)


def innermost_enclosing(
    q_track: np.ndarray,
    q_ts: np.ndarray,
    track: np.ndarray,
    start: np.ndarray,
    dur: np.ndarray,
    parent: np.ndarray,
    candidates: np.ndarray,
) -> np.ndarray:
    """For each query (track, time), the row of the innermost candidate span containing it, or -1.

    `candidates` is a boolean mask over the spans (e.g. host ops); `parent` comes from
    `nest_spans` over all spans, and is followed upwards to skip spans that do not contain the time
    or are not candidates.
    """
    result = np.full(len(q_ts), -1, dtype=np.int64)
    rows = np.flatnonzero(candidates)
    if len(rows) == 0 or len(q_ts) == 0:
        return result
    end = start + dur
    order = rows[np.lexsort((start[rows], track[rows]))]
    q_order = np.lexsort((q_ts, q_track))
    for seg in _track_segments(track, order):
        t = track[seg[0]]
        qsel = q_order[q_track[q_order] == t]
        if len(qsel) == 0:
            continue
        k = np.searchsorted(start[seg], q_ts[qsel], side="right") - 1
        cur = np.where(k >= 0, seg[np.maximum(k, 0)], -1)
        # Walk up while the current span does not contain the time or is no candidate.
        for _ in range(int(np.iinfo(np.int16).max)):
            live = cur >= 0
            bad = np.zeros(len(cur), dtype=bool)
            bad[live] = (end[cur[live]] < q_ts[qsel][live]) | ~candidates[cur[live]]
            if not bad.any():
                break
            cur[bad] = parent[cur[bad]]
        result[qsel] = cur
    return result
