"""Handoffs between the host threads of one process, for the critical path's graph
(`workbench.analysis.critical_path_graph`).

With no wake-up records in a trace, one thread waiting on another shows as one thread idling (between two of its
nodes: its own time in an open event, or untraced time) while another thread of its process runs a burst that
starts after it went idle, ends before it resumes, fills at least `HANDOFF_COVER` of the idle time and has
nothing open at either end: the main thread inside `backward()` while autograd's device thread runs the backward
ops. Such a pair gives a fork (the idle thread's last node → the burst's first) and a join (the burst's last node
→ the node the idle thread resumes at). The search is pairwise, so it runs among each process's
`HANDOFF_THREADS` busiest threads.
"""

from __future__ import annotations

import numpy as np

HANDOFF_COVER = 0.5
"""Least share of a thread's idle time another thread's burst must fill to count as the work it waited on."""
HANDOFF_THREADS = 16
"""Threads per process (those with the most events in the step) searched for handoffs: a thread that hands work
over (a main thread, autograd's device thread) is among the busiest."""

Chain = tuple[int, np.ndarray, np.ndarray]
"""One thread's chain: its pid, its nodes in order, and whether an event is open after each node."""


def handoffs(ts: np.ndarray, chains: list[Chain]) -> list[tuple[int, int, int, int]]:
    """(idle thread's last node, burst's first node, burst's last node, node the idle thread resumes at) of every
    handoff (the module docstring) among `chains`, nodes timed by `ts`."""
    by_pid: dict[int, list[Chain]] = {}
    for chain in sorted(chains, key=lambda c: -len(c[1])):
        if len(by_pid.setdefault(chain[0], [])) < HANDOFF_THREADS:
            by_pid[chain[0]].append(chain)
    found = []
    for busiest in by_pid.values():
        for _, nodes, _ in busiest:
            gap_a, gap_b = nodes[:-1], nodes[1:]
            idle = ts[gap_b] - ts[gap_a]
            for _, other, busy_after in busiest:
                if other is nodes or len(other) < 2:
                    continue
                times = ts[other]
                first = np.searchsorted(times, ts[gap_a], side="right")
                last = np.searchsorted(times, ts[gap_b], side="right") - 1
                ok = (first < last) & (last < len(other))
                first, last = np.minimum(first, len(other) - 1), np.maximum(last, 0)
                ok &= times[last] - times[first] >= HANDOFF_COVER * idle
                ok &= ~busy_after[last] & ((first == 0) | ~busy_after[np.maximum(first - 1, 0)])
                found += [(int(gap_a[g]), int(other[first[g]]), int(other[last[g]]), int(gap_b[g]))
                          for g in np.flatnonzero(ok).tolist()]
    return found
