"""Vectorized nesting: span order, parent/depth and enclosing-span lookup against plain loops."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.trace.nesting import innermost_enclosing, nest_spans, span_order


@pytest.mark.parametrize("seed", range(5))
def test_span_order_matches_lexsort(seed):
    rng = np.random.default_rng(seed)
    n = 2000
    track = rng.integers(0, 4, n)
    start = rng.integers(0, 300, n)  # many ties
    dur = rng.integers(0, 50, n)
    order = span_order(track, start, dur)
    expected = np.lexsort((-dur, start, track))
    keys = np.stack([track, start, -dur], axis=1)
    assert (keys[order] == keys[expected]).all()
    assert sorted(order.tolist()) == list(range(n))


def _nested_spans(rng, n):
    """Random properly nested spans on a few tracks, built by recursive splitting."""
    track, start, dur = [], [], []

    def split(t, lo, hi, depth):
        track.append(t)
        start.append(lo)
        dur.append(hi - lo)
        if depth < 5 and hi - lo > 4:
            cuts = np.sort(rng.choice(np.arange(lo + 1, hi), size=min(4, hi - lo - 1), replace=False))
            for a, b in zip(cuts[::2], cuts[1::2], strict=False):
                split(t, int(a), int(b), depth + 1)

    for t in range(3):
        for k in range(n):
            split(t, k * 1000, k * 1000 + 900, 0)
    return np.array(track), np.array(start, dtype=np.int64), np.array(dur, dtype=np.int64)


def _loop_parents(track, start, dur):
    parent = np.full(len(start), -1)
    for i in range(len(start)):
        best = -1
        for j in range(len(start)):
            if j != i and track[j] == track[i] and start[j] <= start[i] and start[i] + dur[i] <= start[j] + dur[j] \
                    and (start[j], -dur[j], j) < (start[i], -dur[i], i) and (best < 0 or dur[j] < dur[best]):
                best = j
        parent[i] = best
    return parent


def test_nest_spans_matches_a_loop():
    rng = np.random.default_rng(1)
    track, start, dur = _nested_spans(rng, 4)
    parent, depth = nest_spans(track, start, dur)
    assert (parent == _loop_parents(track, start, dur)).all()
    for i, p in enumerate(parent):
        assert depth[i] == (0 if p < 0 else depth[p] + 1)


def test_innermost_enclosing():
    track = np.array([0, 0, 0, 1])
    start = np.array([0, 10, 30, 0])
    dur = np.array([100, 10, 5, 50])
    parent, _ = nest_spans(track, start, dur)
    is_op = np.array([True, True, False, True])
    rows = innermost_enclosing(np.array([0, 0, 0, 1, 0]), np.array([15, 31, 200, 10, 50]), track, start, dur,
                               parent, is_op)
    assert rows.tolist() == [1, 0, -1, 3, 0]
