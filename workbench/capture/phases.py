"""Phase labels that every profiler sees: one name, both a `record_function` and an NVTX range.

The same label then shows in Kineto traces (torch.profiler) and in Nsight Systems timelines, so a
region can be found by name whichever tool captured it. The `nvtx` package is a no-op without
Nsight attached (`torch.cuda.nvtx` is not used: it raises on CPU builds of torch). A phase also
measures its own wall time, so run records carry phase timings even when no profiler runs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager

import nvtx
import torch

NVTX_DOMAIN = "workbench"
"""NVTX domain of the workbench's ranges, so Nsight groups them apart from the framework's own."""

SETUP = ("load", "compile")
"""The phases that make a variant runnable: preparing it, then its first (compiling) call."""

LIFECYCLE = (*SETUP, "warmup", "measure")
"""The phases of a variant's profiled lifecycle, in order; `measure` holds one `step N` per iteration."""


def step_label(n: int) -> str:
    """The label of the n-th (0-based) measured iteration."""
    return f"step {n}"


@contextmanager
def phase(name: str, timings: MutableMapping[str, float] | None = None) -> Iterator[None]:
    """Label the enclosed region `name` for torch.profiler and NVTX; with `timings`, add its wall
    time in milliseconds to `timings[name]` (repeated names accumulate), also when it raises."""
    start = time.perf_counter_ns()
    try:
        with torch.profiler.record_function(name), nvtx.annotate(name, domain=NVTX_DOMAIN):
            yield
    finally:
        if timings is not None:
            timings[name] = timings.get(name, 0.0) + (time.perf_counter_ns() - start) / 1e6
