"""Interval arithmetic of the timeline's density (`workbench.analysis.timeline.density`): the union of intervals
per lane, intervals cut at bin edges, and how many intervals overlap each bin. Vectorized numpy over all lanes at
once (a lane is an offset on one axis), never a Python object per interval."""

from __future__ import annotations

import numpy as np


def union_intervals(lane: np.ndarray, start: np.ndarray, end: np.ndarray, span: int) -> tuple[np.ndarray, ...]:
    """The union of intervals per lane (|times| <= span), as (lane, start, end) of disjoint intervals."""
    if len(start) == 0:
        return lane, start, end
    # Lanes are set apart on one axis, so that one running max serves all: lane · (2·span + 2) + time. Where
    # that would pass int64 (times near 2**62 ns in a broken trace), the times are replaced by their ranks
    # among all of them, which order alike.
    start_key, end_key, step = start, end, 2 * span + 2
    if (int(lane.max()) + 1) * step >= 2**63:
        times, ranks = np.unique(np.concatenate([start, end]), return_inverse=True)
        start_key, end_key, step = ranks[:len(start)], ranks[len(start):], len(times)
    shift = lane.astype(np.int64) * step
    order = np.lexsort((start, lane))
    reach = np.maximum.accumulate(end_key[order] + shift[order])
    head = np.ones(len(order), dtype=bool)
    head[1:] = start_key[order][1:] + shift[order][1:] > reach[:-1]
    first = np.flatnonzero(head)
    return lane[order][first], start[order][first], np.maximum.reduceat(end[order], first)


def spread(lane: np.ndarray, start: np.ndarray, end: np.ndarray, width: float,
           n_bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut intervals (ns from the origin) at bin edges: per piece its cell (lane·n_bins + bin), its
    length in ns and the index of the interval it came from."""
    first = np.minimum((start / width).astype(np.int64), n_bins - 1)
    last = np.clip(np.ceil(end / width).astype(np.int64) - 1, first, n_bins - 1)
    whole = np.flatnonzero(first == last)  # most intervals sit inside one bin: nothing to cut
    cut = np.flatnonzero(first != last)
    pieces = last[cut] - first[cut] + 1
    cut_owner = np.repeat(cut, pieces)
    cut_bin = first[cut_owner] + np.arange(len(cut_owner)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    cut_overlap = np.minimum(end[cut_owner], (cut_bin + 1) * width) - np.maximum(start[cut_owner], cut_bin * width)
    owner = np.concatenate([whole, cut_owner])
    bin_ = np.concatenate([first[whole], cut_bin])
    overlap = np.concatenate([(end[whole] - start[whole]).astype(np.float64), np.maximum(cut_overlap, 0.0)])
    return lane[owner].astype(np.int64) * n_bins + bin_, overlap, owner


def overlapping_counts(lane: np.ndarray, start: np.ndarray, end: np.ndarray, width: float, n_bins: int,
                       n_lanes: int) -> np.ndarray:
    """Per cell (lane·n_bins + bin), how many events overlap the bin (times in ns from the origin; an instant
    overlaps the bin it is in, one outside the extent the bin at its edge): +1 where an event's first bin is
    and -1 past its last, summed along each lane (a stride of n_bins + 1 keeps the -1 inside its lane)."""
    first = np.clip(np.floor(start / width), 0, n_bins - 1).astype(np.int64)
    last = np.clip(np.ceil(end / width).astype(np.int64) - 1, first, n_bins - 1)
    stride = n_bins + 1
    size = n_lanes * stride
    delta = np.bincount(lane * stride + first, minlength=size) - np.bincount(lane * stride + last + 1, minlength=size)
    return np.cumsum(delta.reshape(n_lanes, stride), axis=1)[:, :n_bins].ravel()
