"""Torch's intra-op threads during a run: one by default on small machines, and a block that sets them.

Several intra-op threads on a machine of few cores fight the rest of the machine (the Jupyter server, the
profiler, other jobs) for those cores, which makes latency samples noisy (`workbench.analysis.noise`); one
thread gives the steadiest numbers there. An explicit count is always kept.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

FEW_CORES = 4
"""On a machine with this many usable cores or fewer, runs use one torch thread unless told otherwise."""


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform tells it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_threads(threads: int | None) -> int | None:
    """The torch threads a run uses: `threads` when given; else 1 on a machine with FEW_CORES usable cores or
    fewer; else None (torch's own setting)."""
    if threads is not None:
        return threads
    return 1 if usable_cores() <= FEW_CORES else None


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with `default_threads(threads)` intra-op threads (None: unchanged), restoring the count
    after."""
    threads = default_threads(threads)
    if threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
