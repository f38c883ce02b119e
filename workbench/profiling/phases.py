"""Phase labels that every profiler sees: one name, an NVTX range, and (when torch or JAX is loaded) a
torch.profiler `record_function` and a jax.profiler `TraceAnnotation`.

The same label then shows in Kineto traces (torch.profiler) and in Nsight Systems timelines, so a
region can be found by name whichever tool captured it. The `nvtx` package is a no-op without
Nsight attached (`torch.cuda.nvtx` is not used: it raises on CPU builds of torch). A phase never imports a
framework itself: without torch loaded no torch.profiler records (an import of traces times its phases without
loading torch). A phase also measures its own wall time, so run records carry phase timings even when no
profiler runs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, MutableMapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import nvtx

NVTX_DOMAIN = "workbench"
"""NVTX domain of the workbench's ranges, so Nsight groups them apart from the framework's own."""



def _torch_record_function(name: str) -> AbstractContextManager[Any]:
    """A torch.profiler `record_function` when torch is loaded (only then can torch.profiler be recording),
    else nothing: the phase never imports torch itself."""
    if "torch" not in sys.modules:
        return nullcontext()
    from torch.profiler import record_function

    return record_function(name)


def _jax_annotation(name: str) -> AbstractContextManager[Any]:
    """A jax.profiler `TraceAnnotation` when JAX is loaded (so XSpace captures carry the phase names
    too), else nothing: the phase never imports JAX itself."""
    if "jax" not in sys.modules:
        return nullcontext()
    from jax.profiler import TraceAnnotation

    return TraceAnnotation(name)


@contextmanager
def phase(name: str, timings: MutableMapping[str, float] | None = None) -> Iterator[None]:
    """Label the enclosed region `name` for torch.profiler and NVTX; with `timings`, add its wall
    time in milliseconds to `timings[name]` (repeated names accumulate), also when it raises."""
    start = time.perf_counter_ns()
    try:
        with _torch_record_function(name), nvtx.annotate(name, domain=NVTX_DOMAIN), _jax_annotation(name):
            yield
    finally:
        if timings is not None:
            timings[name] = timings.get(name, 0.0) + (time.perf_counter_ns() - start) / 1e6
